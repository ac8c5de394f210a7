"""A checkpoint file that ``torch.load`` cannot read, said in one line that names it, instead of torch's traceback
(whose text for an unpickling error is a page about ``weights_only`` that asks to file an issue)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager

from lightning_scale.errors import ConfigurationError

__all__ = ["UNREADABLE", "gist", "named_if_unreadable"]

UNREADABLE = (EOFError, pickle.UnpicklingError, RuntimeError, ValueError)
"""What ``torch.load`` raises for a file that is cut short, damaged or not a ``torch.save`` file (an unreachable
store raises ``OSError``: an outage, worth retrying, which stays one)."""


def gist(err: BaseException) -> str:
    """``err``'s type and the first line of its text; for an unpickling error, only that it does not unpickle.

    Examples:
        >>> gist(EOFError())
        'EOFError: it ends early'
        >>> gist(RuntimeError("PytorchStreamReader failed reading zip archive\\nmore"))
        'RuntimeError: PytorchStreamReader failed reading zip archive'
    """
    lines = [] if isinstance(err, pickle.UnpicklingError) else str(err).splitlines()
    detail = lines[0][:200] if lines else "it ends early" if isinstance(err, EOFError) else "it does not unpickle"
    return f"{type(err).__name__}: {detail}"


@contextmanager
def named_if_unreadable(what: str) -> Iterator[None]:
    """Turn a load of ``what`` (a file's URL) that fails with one of :data:`UNREADABLE` into a ``ConfigurationError``
    that names it and says what to do."""
    try:
        yield
    except UNREADABLE as err:
        raise ConfigurationError(
            f"{what} cannot be read ({gist(err)}): the checkpoint is damaged or not a checkpoint; resume from (or "
            "consolidate) an intact one."
        ) from None
