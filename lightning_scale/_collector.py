"""Lightning's and torch's import-time objects kept out of the cyclic garbage collector.

Importing them creates about 500 K objects that live as long as the process. The collector would otherwise walk them
while they are created, in every full collection during training (a pause of ~0.2 s that stalls every other rank at
its next collective) and once more when the process exits: a third of the CPU of a process that imports the package
and exits (``benchmarks/process_start.py``). They are imported with the collector paused and frozen as they are
(``gc.freeze``, made for long-lived objects of processes that fork: forked DataLoader workers also stop copying their
pages when they collect), the recipe of ``gc.freeze``'s documentation. The import's own garbage, about 9 K objects
(~7 MB: tuples, closures and type aliases of modules' set-up code, tracebacks of failed optional imports), is frozen
with them rather than collected: finding it is a full collection over every object, ~0.35 s of CPU in each process.
Objects created later are collected as usual; ``gc.unfreeze()`` undoes the freeze.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Run the block (imports) with the collector paused, then freeze what it created; the collector runs again
    afterwards if it ran before.

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
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
