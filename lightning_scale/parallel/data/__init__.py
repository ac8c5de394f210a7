"""Data parallel building blocks: gradient compression hooks and ZeRO-1 optimizer sharding (no Lightning imports)."""

from lightning_scale.parallel.data.compression import (
    COMPRESSIONS,
    Compression,
    CompressionHook,
    PowerSGDHook,
    check_powersgd_settings,
    compression_hook,
)
from lightning_scale.parallel.data.zero import shard_optimizer, training_state_bytes

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "CompressionHook",
    "PowerSGDHook",
    "check_powersgd_settings",
    "compression_hook",
    "shard_optimizer",
    "training_state_bytes",
]
