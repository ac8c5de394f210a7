"""Shared fixtures: every test leaves environment variables, signal handlers and the process group as it found them."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_scale import knobs
from lightning_scale._warnings import ignore_library_warnings
from tests import suite_guards
from tests.faulty_fs import FaultyFileSystem

pytest_plugins = ["tests.s3"]  # the S3 server fixtures

_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]


_SHARED_MEMORY = Path("/dev/shm")
_shared_memory_before: set[str] = set()
_shared_memory_left: set[str] = set()
_shared_memory_first_seen: dict[str, str] = {}  # entry -> the test after which it was first seen
_ON_CI = suite_guards.on_ci(os.environ)


def pytest_configure(config: pytest.Config) -> None:
    # pytest restores the warning filters it saw at start-up around every collection and test, so the filters that
    # importing lightning_scale installs (during collection) would not last: install them first, as a user's run has
    ignore_library_warnings()
    _shared_memory_before.update(_shared_memory())


def pytest_collection_finish(session: pytest.Session) -> None:
    """A whole run that misses a test function of ``tests/`` (a file or a function pytest does not pick up) fails
    before it starts: the package's doctests alone must not make a passing run."""
    if session.config.option.collectonly or not suite_guards.whole_run(session.config):
        return
    missing = suite_guards.uncollected(Path(__file__).parent, session.items)
    if missing:
        pytest.exit(f"{len(missing)} test functions were not collected: {missing[:5]}", pytest.ExitCode.TESTS_FAILED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Under ``CI=true`` (``.ci/run`` sets it) a skipped test fails."""
    outcome = yield
    if _ON_CI:
        suite_guards.skip_as_failure(outcome.get_result())  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if its processes left anything in /dev/shm (snapshots, named semaphores of killed DataLoader
    queues), after a few seconds for resource trackers to unlink what their processes leaked."""
    deadline = time.monotonic() + 5
    while (left := _shared_memory() - _shared_memory_before) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        _shared_memory_left.update(left)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _shared_memory_left:
        left = sorted(_shared_memory_left)
        terminalreporter.write_line(f"FAILED: the tests left {len(left)} entries in {_SHARED_MEMORY}: {left[:10]}")
        by_test: dict[str, list[str]] = {}
        for entry in left:
            by_test.setdefault(_shared_memory_first_seen.get(entry, "(after the last test)"), []).append(entry)
        for test, entries in by_test.items():
            terminalreporter.write_line(f"  first seen after {test}: {len(entries)} ({entries[:3]})")


@pytest.fixture(autouse=True)
def _note_shared_memory_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Which test an entry of /dev/shm first appeared after: what the failure above names."""
    yield
    for entry in _shared_memory() - _shared_memory_before:
        _shared_memory_first_seen.setdefault(entry, request.node.nodeid)


def _shared_memory() -> set[str]:
    return {entry.name for entry in _SHARED_MEMORY.iterdir()} if _SHARED_MEMORY.is_dir() else set()


@pytest.fixture(autouse=True)
def _restore_process_state() -> Iterator[None]:
    environ = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture(autouse=True)
def snapshot_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Node-local shared memory of this test's memory snapshots (its jobs' too), removed after it: a test that fails
    before its job finished leaves no snapshot behind for the next."""
    root = Path(tempfile.mkdtemp(prefix="lightning-scale-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    monkeypatch.setenv("LIGHTNING_SCALE_SNAPSHOT_DIR", str(root))
    monkeypatch.setattr(knobs, "SNAPSHOT_DIR", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tiny_trainer_kwargs(tmp_path) -> dict:
    """Trainer arguments for quick single-process CPU fits in unit tests, writing nothing outside ``tmp_path``."""
    return {
        "default_root_dir": str(tmp_path),
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "limit_val_batches": 0,
    }


@pytest.fixture
def faulty() -> Iterator[type[FaultyFileSystem]]:
    """The ``faulty://`` in-memory filesystem, empty, its gate open and no failures injected."""
    FaultyFileSystem.reset()
    yield FaultyFileSystem
    FaultyFileSystem.reset()
