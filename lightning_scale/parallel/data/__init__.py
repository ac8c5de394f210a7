"""Data parallel building blocks: gradient compression hooks and ZeRO-1/2 sharding (no Lightning imports)."""

from lightning_scale.parallel.data.compression import (
    COMPRESSIONS,
    Compression,
    CompressionHook,
    PowerSGDHook,
    check_powersgd_settings,
    compression_hook,
)
from lightning_scale.parallel.data.zero import ELEMENTWISE_OPTIMIZERS, ZeroSharding, ZeroStage
from lightning_scale.parallel.data.zero_state import (
    SHARDS_KEY,
    chunked_state_dict,
    own_chunks,
    sharded_state_dict,
    training_state_bytes,
    whole_state_dict,
)

__all__ = [
    "COMPRESSIONS",
    "ELEMENTWISE_OPTIMIZERS",
    "SHARDS_KEY",
    "Compression",
    "CompressionHook",
    "PowerSGDHook",
    "ZeroSharding",
    "ZeroStage",
    "check_powersgd_settings",
    "chunked_state_dict",
    "compression_hook",
    "own_chunks",
    "sharded_state_dict",
    "training_state_bytes",
    "whole_state_dict",
]
