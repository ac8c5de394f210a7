"""Callbacks' state keys, formatted once per set of settings.

Lightning asks every callback for its ``state_key`` at every hook it calls (the key names the profiler's action), six
times a training step for each callback. A key made of settings, as ``ModelCheckpoint``'s and ``EarlyStopping``'s
are, formats their ``repr`` each time: ~2 µs a call, a few tens of µs a step for our callbacks, a share of a short
step's time that users pay for nothing (``benchmarks/callback_overhead.py``). :func:`settings_state_key` keeps the
key until a setting changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

_CACHE = "_lightning_scale_state_key"


def settings_state_key(callback: pl.Callback, generate: Callable[..., str], **settings: Any) -> str:
    """``callback``'s state key for ``settings``, as ``generate`` (its ``_generate_state_key``) formats it, formatted
    again only when they differ from the last call's.

    Example:
        >>> from lightning.pytorch.callbacks import EarlyStopping
        >>> stopping = EarlyStopping(monitor="val_loss")
        >>> settings_state_key(stopping, stopping._generate_state_key, monitor=stopping.monitor)
        "EarlyStopping{'monitor': 'val_loss'}"
        >>> stopping.monitor = "train_loss"
        >>> settings_state_key(stopping, stopping._generate_state_key, monitor=stopping.monitor)
        "EarlyStopping{'monitor': 'train_loss'}"
    """
    cached = callback.__dict__.get(_CACHE)
    if cached is not None and cached[0] == settings:
        return cached[1]
    key = generate(**settings)
    callback.__dict__[_CACHE] = (settings, key)
    return key
