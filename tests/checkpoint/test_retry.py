"""with_retries: which errors are tried again, how long it waits, and what it raises in the end."""

from __future__ import annotations

import errno

import pytest

from lightning_scale.checkpoint.retry import is_transient, with_retries


class EndpointConnectionError(Exception):
    """Named like botocore's, which is not a builtin ConnectionError."""


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (EndpointConnectionError("down"), True),
        (OSError(errno.EIO, "I/O error"), True),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), False),
        (FileNotFoundError("no such bucket"), False),
        (PermissionError("access denied"), False),
        (ValueError("cannot pickle"), False),
    ],
)
def test_is_transient(error, transient):
    assert is_transient(error) is transient


def test_transient_failures_are_retried_with_doubling_waits_and_the_last_error_is_raised():
    waits: list[float] = []
    calls = []

    def always_down():
        calls.append(1)
        raise ConnectionResetError(f"attempt {len(calls)}")

    with pytest.raises(ConnectionResetError, match="attempt 4"):
        with_retries(always_down, "an upload", attempts=4, backoff_s=0.5, sleep=waits.append)
    assert waits == [0.5, 1.0, 2.0]


def test_a_permanent_failure_is_raised_at_once():
    waits: list[float] = []

    def disk_full():
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        with_retries(disk_full, "a write", attempts=4, backoff_s=0.5, sleep=waits.append)
    assert waits == []
