"""WorkerStartWatchdog: stuck DataLoader workers become a report with their stacks and an exit code."""

from __future__ import annotations

import faulthandler
import multiprocessing
import signal
import threading
import time

import pytest

from lightning_scale.data import STUCK_WORKERS_EXIT_CODE, WorkerStartWatchdog


def stuck_in_start_up() -> None:
    while True:  # a worker that never delivers, e.g. deadlocked while it starts
        time.sleep(0.1)


@pytest.fixture
def exits() -> list[int]:
    yield []
    faulthandler.unregister(signal.SIGUSR2)


def test_stuck_workers_are_reported_with_their_stacks_stopped_and_the_process_exits(exits, capfd):
    done = threading.Event()
    watchdog = WorkerStartWatchdog(timeout_s=1.0, exit_fn=lambda code: (exits.append(code), done.set()))
    watchdog.arm("rank 0, training dataloader(s) of epoch 0")
    worker = multiprocessing.get_context("fork").Process(target=stuck_in_start_up, daemon=True)
    worker.start()  # forked after arm(): it inherits the handler that dumps its stacks, as Lightning's workers do
    started = time.monotonic()
    assert done.wait(20)
    assert exits == [STUCK_WORKERS_EXIT_CODE] and time.monotonic() - started < 10
    worker.join(5)
    assert not worker.is_alive()  # stopped, not left behind
    err = capfd.readouterr().err
    assert f"epoch 0: no batch 1 s after its DataLoader workers started (worker pids [{worker.pid}])" in err
    assert err.count("in stuck_in_start_up") == 1  # the worker's own stack, from inside it
    assert "test_stuck_workers_are_reported" in err  # this process's stacks
    watchdog.close()


def test_a_batch_in_time_disarms_and_close_is_safe_twice(exits):
    watchdog = WorkerStartWatchdog(timeout_s=0.3, exit_fn=exits.append)
    for epoch in range(3):
        watchdog.arm(f"epoch {epoch}")
        time.sleep(0.1)
        watchdog.disarm()
    time.sleep(0.5)
    watchdog.close()
    watchdog.close()
    assert exits == []


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match=r"timeout_s=0 must be > 0"):
        WorkerStartWatchdog(timeout_s=0)
