"""Data parallel building blocks: gradient compression hooks and ZeRO-1 optimizer sharding (no Lightning imports)."""

from lightning_scale.parallel.data.compression import (
    COMPRESSIONS,
    Compression,
    CompressionHook,
    PowerSGDHook,
    check_powersgd_settings,
    compression_hook,
)
from lightning_scale.parallel.data.zero import (
    SHARDS_KEY,
    own_share,
    shard_optimizer,
    sharded_state_dict,
    training_state_bytes,
    whole_state_dict,
)

__all__ = [
    "COMPRESSIONS",
    "SHARDS_KEY",
    "Compression",
    "CompressionHook",
    "PowerSGDHook",
    "check_powersgd_settings",
    "compression_hook",
    "own_share",
    "shard_optimizer",
    "sharded_state_dict",
    "training_state_bytes",
    "whole_state_dict",
]
