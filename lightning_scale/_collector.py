"""Lightning's and torch's import-time objects kept out of the cyclic garbage collector.

Importing them creates about 340 K objects that live as long as the process. The collector would otherwise walk them
while they are created, in every full collection during training (a pause of ~0.2 s that stalls every other rank at
its next collective) and once more when the process exits: a third of the CPU of a process that imports the package
and exits (``benchmarks/process_start.py``: 0.67 of the 3.1 s it takes with the collector left to walk them). They
are imported with the collector paused, the import's garbage is collected once, and what is left is frozen
(``gc.freeze``, made for long-lived objects of processes that fork: forked DataLoader workers also stop copying their
pages when they collect). Objects created later are collected as usual; ``gc.unfreeze()`` undoes the freeze.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Run the block (imports) with the collector paused, then collect its garbage and freeze what is left; the
    collector runs again afterwards if it ran before.

    Example:
        >>> frozen = gc.get_freeze_count()
        >>> with imports_frozen():
        ...     modules = [type("Module", (), {})]
        ...     gc.isenabled()
        False
        >>> gc.isenabled() and gc.get_freeze_count() > frozen
        True
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.collect()
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
