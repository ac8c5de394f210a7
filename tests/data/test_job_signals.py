"""DataLoader workers under ``ShieldFromJobSignals`` survive a SIGTERM sent from outside (SLURM signals every process
of a job step) and still end when their loader's own process terminates them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_scale.data import ShieldFromJobSignals, shield_workers

pytestmark = pytest.mark.timeout(120)


def _loader(worker_init_fn, context: str = "fork") -> StatefulDataLoader:
    return StatefulDataLoader(
        range(64), batch_size=2, num_workers=2, worker_init_fn=worker_init_fn, multiprocessing_context=context
    )


def _signal_from_another_process(pids: list[int], name: str = "SIGTERM") -> None:
    kill = f"import os, signal; [os.kill(p, signal.{name}) for p in {pids!r}]"
    subprocess.run([sys.executable, "-c", kill], check=True)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_shielded_workers_survive_job_signals_from_outside_and_the_loader_goes_on(context, capfd, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # spawn workers that import torch start a thread (the suite sets 1)
    loader = _loader(None, context)
    assert shield_workers(loader, ("SIGTERM", "SIGUSR1"))
    iterator = iter(loader)
    batches = [next(iterator).tolist() for _ in range(2)]  # one from each worker
    workers = list(iterator._workers)
    _signal_from_another_process([w.pid for w in workers], "SIGTERM")
    _signal_from_another_process([w.pid for w in workers], "SIGUSR1")
    time.sleep(0.5)
    assert all(w.is_alive() for w in workers)
    batches += [batch.tolist() for batch in iterator]
    assert batches == [[i, i + 1] for i in range(0, 64, 2)]
    err = capfd.readouterr().err
    assert err.count("ignores SIGTERM from pid") == 2 and err.count("ignores SIGUSR1 from pid") == 2
    assert "can still receive" not in err  # spawn workers import torch, which starts a thread: blocked from birth


def test_the_function_alone_cannot_cover_threads_started_before_it_and_says_so(capfd, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # spawn workers that import torch start a thread (the suite sets 1)
    loader = _loader(ShieldFromJobSignals(), "spawn")  # without shield_workers: nothing blocked at the start
    assert len(list(loader)) == 32
    assert "thread(s) started before worker_init_fn can still receive SIGTERM, SIGUSR1" in capfd.readouterr().err


def test_without_the_shield_a_sigterm_from_outside_kills_the_workers_and_fails_the_loader():
    iterator = iter(_loader(None))
    next(iterator)
    # torch's error, or, when a worker dies while the main process takes a batch's shared memory from it, the reset
    # connection of that transfer: either way the loader fails
    failed = r"DataLoader worker \(pid.* (killed by signal: Terminated|exited unexpect)|Connection reset by peer"
    with pytest.raises((RuntimeError, ConnectionResetError), match=failed):
        _signal_from_another_process([w.pid for w in iterator._workers])
        for _ in iterator:  # torch's SIGCHLD handler raises wherever the main process is, or the next fetch fails
            time.sleep(0.05)
    with contextlib.suppress(RuntimeError):  # torch's SIGCHLD handler may report the other killed worker here
        iterator._shutdown_workers()


def test_the_loaders_own_process_still_terminates_a_shielded_worker():
    loader = _loader(None)
    shield_workers(loader, ("SIGTERM",))
    iterator = iter(loader)
    next(iterator)
    worker = iterator._workers[0]
    worker.terminate()  # what the loader does to a worker that does not stop when asked
    worker.join(timeout=10)
    assert worker.exitcode == 0
    iterator._shutdown_workers()


def test_shield_workers_wraps_the_loaders_own_worker_init_fn_once_and_skips_loaders_without_workers():
    def init(worker_id: int) -> None:
        pass

    loader = _loader(init)
    assert shield_workers(loader, ("SIGTERM",)) and not shield_workers(loader, ("SIGTERM",))
    assert loader.worker_init_fn.worker_init_fn is init and loader.worker_init_fn.signals == ("SIGTERM",)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert not shield_workers(StatefulDataLoader(range(4), num_workers=0), ("SIGTERM",))


def test_signal_names_are_checked_when_the_shield_is_made():
    with pytest.raises(ValueError, match=r"signals=\['SIGTREM'\]: unknown.*SIGTERM"):
        ShieldFromJobSignals(signals=("SIGTREM",))
    with pytest.raises(ValueError, match=r"signals=\['SIGKILL'\]: unknown"):
        ShieldFromJobSignals(signals=("SIGKILL",))  # cannot be blocked
