"""An in-memory fsspec filesystem (``faulty://``) whose checkpoint writes can be held back or made to fail."""

from __future__ import annotations

import errno
import threading

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

PROTOCOL = "faulty"


class FaultyFileSystem(MemoryFileSystem):
    """``memory://`` with two faults for files being written under a temporary ``.partial`` name.

    ``gate`` (a ``threading.Event``) holds every such write until it is set; a write whose name contains one of
    ``fail_names`` raises ``ENOSPC`` ("No space left on device") as a full disk would.
    """

    protocol = (PROTOCOL,)
    store: dict = {}  # class-level, as in fsspec, but separate from memory://
    pseudo_dirs: list = [""]
    gate = threading.Event()
    fail_names: tuple[str, ...] = ()
    writes_started = 0

    @classmethod
    def reset(cls) -> None:
        cls.store.clear()
        cls.pseudo_dirs[:] = [""]
        cls.gate.set()
        cls.fail_names = ()
        cls.writes_started = 0

    @classmethod
    def _strip_protocol(cls, path):
        path = fsspec.core.stringify_path(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(f"{PROTOCOL}://") :]
        return MemoryFileSystem._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and ".partial" in path:
            type(self).writes_started += 1
            if not type(self).gate.wait(timeout=60):
                raise TimeoutError("the test never opened the gate")
            if any(name in path for name in type(self).fail_names):
                raise OSError(errno.ENOSPC, "No space left on device", path)
        return super()._open(path, mode, **kwargs)


fsspec.register_implementation(PROTOCOL, FaultyFileSystem, clobber=True)
