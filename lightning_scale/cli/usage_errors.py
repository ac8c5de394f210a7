"""What the command treats as a usage error, and how it reports one.

A usage error is an exception of type :class:`~lightning_scale.errors.UsageError` (every check of lightning-scale
raises one, e.g. :class:`~lightning_scale.errors.ConfigurationError`), or an exception raised from or while handling
one. The command reports it in one line without a traceback, once per launch on each node, and every rank that finds
it exits with :data:`~lightning_scale.errors.USAGE_ERROR_EXIT_CODE`. Local rank 0 reports what it found; another rank
reports its own only when local rank 0 has not reported within :data:`REPORT_WAIT_S` (a check that fails on that
rank alone, such as a path its node lacks), and local rank 0, whose next collective then fails, exits with the same
code without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from lightning_scale.cli.attempts import launch_id
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE, UsageError

__all__ = ["REPORT_WAIT_S", "exit_on_usage_error", "reported_on_this_node", "usage_error_in"]

REPORT_WAIT_S = 2.0
"""How long a rank other than local rank 0 waits for local rank 0's report before it reports its own usage error."""


def usage_error_in(error: BaseException | None) -> BaseException | None:
    """``error`` or the exception it was raised from or during, if it is a :class:`UsageError`."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, UsageError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def exit_on_usage_error(message: str) -> NoReturn:
    """Report ``message`` (see the module's description), then exit with :data:`USAGE_ERROR_EXIT_CODE`."""
    marker = _report_marker()
    if marker is None or os.environ.get("LOCAL_RANK", "0") == "0":
        _report(message)
        if marker is not None:
            with contextlib.suppress(OSError):  # only keeps the other ranks quiet
                marker.touch()
    else:
        deadline = time.monotonic() + REPORT_WAIT_S
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not marker.exists():
            _report(message)
            with contextlib.suppress(OSError):  # tells local rank 0 that its own failure follows from this one
                marker.touch()
    raise SystemExit(USAGE_ERROR_EXIT_CODE)


def reported_on_this_node() -> bool:
    """Whether a process of this launch on this node reported a usage error: another failure of this process (a
    collective whose peer left) follows from it and exits with the same code, without a traceback of its own."""
    marker = _report_marker()
    return marker is not None and marker.exists()


def _report(message: str) -> None:
    print(f"lightning-scale: error: {message}", file=sys.stderr, flush=True)


def _report_marker() -> Path | None:
    """The file a process of this launch on this node leaves once it reported a usage error; ``None`` for a process
    alone."""
    launch = launch_id()
    return None if launch is None else Path(tempfile.gettempdir()) / f"lightning-scale-reported-{launch}"
