"""Objects that pickle and deep-copy without what lives in one process only (locks, threads, process groups, the
Trainer): Lightning pickles the Trainer with its callbacks for ``ddp_spawn``, and users deep-copy callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["ProcessLocal"]


class ProcessLocal:
    """A mixin: the attributes named in ``PROCESS_LOCAL`` are left out of the pickled state, and a copy gets a fresh
    value from each one's factory (``None`` when the factory is ``None``)."""

    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in self.PROCESS_LOCAL}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name, fresh in self.PROCESS_LOCAL.items():
            setattr(self, name, None if fresh is None else fresh())
