"""Retrying storage work on transient errors, with exponential backoff.

Object-store clients retry single requests already (s3fs and botocore do, a few times within seconds); this retries
a whole step (an upload, a rename) for outages that outlast them. Errors that another attempt cannot fix (a full disk,
a missing bucket, a refused permission, a bad object to serialise) are raised at once.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from lightning_scale import knobs

__all__ = ["is_transient", "is_unreachable", "with_retries"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_PERMANENT_ERRNOS = {
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EISDIR, errno.ENOTDIR,
    errno.ENAMETOOLONG, errno.EINVAL, errno.EEXIST,
}  # fmt: skip


def is_transient(error: BaseException) -> bool:
    """Whether another attempt may succeed: connection failures and timeouts (builtin, or a client library's class
    named like ``EndpointConnectionError``/``ReadTimeoutError``), and ``OSError`` without a permanent errno.

    Examples:
        >>> is_transient(ConnectionResetError()), is_transient(OSError(errno.ENOSPC, "No space left on device"))
        (True, False)
    """
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if is_unreachable(error):
        return True
    return isinstance(error, OSError) and error.errno not in _PERMANENT_ERRNOS


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the other end did not answer: a connection failure or a timeout, builtin or a client
    library's own class (botocore's ``EndpointConnectionError`` is not a builtin ``ConnectionError``).

    Examples:
        >>> class EndpointConnectionError(Exception): ...
        >>> is_unreachable(EndpointConnectionError()), is_unreachable(TimeoutError()), is_unreachable(ValueError())
        (True, True, False)
    """
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return any("Connection" in cls.__name__ or "Timeout" in cls.__name__ for cls in type(error).__mro__)


def with_retries(
    fn: Callable[[], T],
    what: str,
    attempts: int | None = None,
    backoff_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``fn()``, tried up to ``attempts`` times while it fails transiently, waiting ``backoff_s``, then twice as long.

    Defaults come from :data:`knobs.STORAGE_ATTEMPTS` and :data:`knobs.STORAGE_BACKOFF_S`.

    Examples:
        >>> calls = []
        >>> def flaky():
        ...     calls.append(1)
        ...     if len(calls) < 3:
        ...         raise ConnectionResetError("dropped")
        ...     return "done"
        >>> with_retries(flaky, "an upload", attempts=3, sleep=lambda s: None), len(calls)
        ('done', 3)
    """
    attempts = knobs.STORAGE_ATTEMPTS if attempts is None else attempts
    delay = knobs.STORAGE_BACKOFF_S if backoff_s is None else backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if attempt == attempts or not is_transient(err):
                raise
            log.warning(
                f"{what} failed ({type(err).__name__}: {err}); attempt {attempt + 1}/{attempts} in {delay:.1f} s."
            )
            sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
