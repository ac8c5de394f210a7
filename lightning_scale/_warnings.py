"""Warnings that every run would print and no user can act on: the pinned libraries calling each other's deprecated
APIs. Each is ignored only where that library raises it (its module), so the same warning from a user's own code
still shows; installed when ``lightning_scale`` is imported."""

from __future__ import annotations

import warnings

# (message at its start, module that raises it)
_FROM_LIBRARIES = [
    # torchdata's StatefulDataLoader constructor calls torch.set_vital
    ("'set_vital' is deprecated", r"torchdata\.stateful_dataloader\."),
    # Lightning's _pytree helper checks a class torch deprecates, once per rank at the first training step
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
]


def ignore_library_warnings() -> None:
    for message, module in _FROM_LIBRARIES:
        warnings.filterwarnings("ignore", message=message, module=module)
