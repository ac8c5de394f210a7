"""Linux process facts read from ``/proc``."""

from __future__ import annotations

import os

from lightning_scale._linux import process_start


def test_a_process_start_is_read_from_proc_and_stays_the_same():
    started = process_start(os.getpid())
    assert isinstance(started, int) and started > 0 and process_start(os.getpid()) == started
    assert process_start(2**22 + 1) is None  # above any pid: no such process
