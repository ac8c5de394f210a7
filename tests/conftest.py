"""Shared fixtures: every test leaves environment variables, signal handlers and the process group as it found them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_scale import knobs
from lightning_scale._warnings import ignore_library_warnings
from lightning_scale.testing.processes import shared_memory_holders
from tests import suite_guards
from tests.faulty_fs import FaultyFileSystem

pytest_plugins = ["tests.s3"]  # the S3 server fixtures

_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]


_SHARED_MEMORY = Path("/dev/shm")
_SNAPSHOTS = Path(
    tempfile.mkdtemp(prefix="lightning-scale-tests-", dir=_SHARED_MEMORY if _SHARED_MEMORY.is_dir() else None)
)
_shared_memory_before: set[str] = set()
_shared_memory_left: set[str] = set()
# entry -> when it was first seen ("at"), after which test ("test"), and the processes that mapped it once it had
# lasted (``_note_shared_memory_left``: "holders")
_shared_memory_first_seen: dict[str, dict] = {}
_HOLDERS_AFTER_S = 5.0  # an entry this old has its holders looked up, at most once every _HOLDERS_EVERY_S per worker
_HOLDERS_EVERY_S = 10.0
_holders_looked_up = [0.0]  # when this process last did
# where xdist workers leave their first-seen notes for the controller: workers inherit the controller's environment
_FIRST_SEEN_NOTES = Path(os.environ.get("LIGHTNING_SCALE_TEST_SHM_NOTES") or tempfile.mkdtemp(prefix="shm-notes-"))
os.environ["LIGHTNING_SCALE_TEST_SHM_NOTES"] = str(_FIRST_SEEN_NOTES)
_ON_CI = suite_guards.on_ci(os.environ)

# One intra-op thread in each process of the suite (here, and through the environment in every process a test starts;
# a value set outside is kept): the suite runs three workers on CI's two cores, each test's jobs beside them, and
# torch's threads would only wait for each other there: a quarter of the in-process tests' CPU went on that.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker (``make test`` runs the suite on two)."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    # pytest restores the warning filters it saw at start-up around every collection and test, so the filters that
    # importing lightning_scale installs (during collection) would not last: install them first, as a user's run has
    ignore_library_warnings()
    if not _xdist_worker(config):  # the controller (or a run without workers) guards /dev/shm over the whole run
        _shared_memory_before.update(_shared_memory())
    # the snapshots of jobs that module-scoped fixtures launch (before any test's own root below) live here too
    os.environ["LIGHTNING_SCALE_SNAPSHOT_DIR"] = str(_SNAPSHOTS)
    knobs.SNAPSHOT_DIR = str(_SNAPSHOTS)


# The files that take longest (``--durations``), run first so that two xdist workers (docs/development.md), which
# take whole files in collection order (``--dist loadfile --no-loadscope-reorder``), end together: a hint only
_LONGEST_FIRST = (
    "benchmarks/test_benchmarks.py",
    "data/test_user_code_matrix.py",
    "health/test_hang_restarts.py",
    "slurm/test_train_sbatch.py",
    "elastic/test_elastic_job.py",
    "callbacks/test_spot_preemption_jobs.py",
    "callbacks/test_memory_snapshots.py",
    "examples/test_demo.py",
    "restart/test_warm_restarts.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(item.path)
        name = path.relative_to(tests).as_posix() if path.is_relative_to(tests) else ""
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest stay in collection order


def pytest_collection_finish(session: pytest.Session) -> None:
    """A whole run that misses a test function of ``tests/`` (a file or a function pytest does not pick up) fails
    before it starts: the package's doctests alone must not make a passing run."""
    config = session.config
    whole = config.workerinput["whole_run"] if _xdist_worker(config) else suite_guards.whole_run(config)  # type: ignore[attr-defined]
    if config.option.collectonly or not whole:
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


def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """pytest-xdist's hook in the controller: tell each worker whether the controller's run is a whole one (a worker
    is always given its test paths as arguments)."""
    node.workerinput["whole_run"] = suite_guards.whole_run(node.config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if its processes left anything in /dev/shm (snapshots, named semaphores of killed DataLoader
    queues), after a few seconds for resource trackers to unlink what their processes leaked. Under xdist a worker
    hands its notes to the controller, which checks once every worker has finished."""
    if _xdist_worker(session.config):
        with contextlib.suppress(OSError):
            _SNAPSHOTS.rmdir()  # a root that still holds something is left for the controller to report
        notes = _FIRST_SEEN_NOTES / f"{session.config.workerinput['workerid']}.json"  # type: ignore[attr-defined]
        notes.write_text(json.dumps(_shared_memory_first_seen))
        return
    for notes in sorted(_FIRST_SEEN_NOTES.glob("*.json")):  # the earliest note of an entry, whichever worker's
        for entry, note in json.loads(notes.read_text()).items():
            known = _shared_memory_first_seen.get(entry)
            if known is None or note["at"] < known["at"]:
                _shared_memory_first_seen[entry] = note
    shutil.rmtree(_FIRST_SEEN_NOTES, ignore_errors=True)
    deadline = time.monotonic() + 5
    while (left := _shared_memory() - _shared_memory_before) and time.monotonic() < deadline:
        time.sleep(0.2)
    shutil.rmtree(_SNAPSHOTS, ignore_errors=True)
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
            test = _shared_memory_first_seen.get(entry, {}).get("test", "(the last test)")
            by_test.setdefault(test, []).append(entry)
        for test, entries in by_test.items():
            terminalreporter.write_line(f"  first seen after {test}: {len(entries)} ({entries[:3]})")
            for entry in entries[:3]:
                for holder in _shared_memory_first_seen.get(entry, {}).get("holders", []):
                    terminalreporter.write_line(f"    {entry} was mapped by {holder}")


@pytest.fixture(autouse=True)
def _note_shared_memory_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Which test an entry of /dev/shm first appeared after, and which processes mapped it once it had lasted a few
    seconds: what the failure above names (under xdist the test may be another worker's that ran at the same time; the
    holders tell). Most entries are a running job's and go within seconds; finding who maps one reads every process's
    memory map, so it is done for lasting entries only, at most once every few seconds; entries gone are forgotten."""
    yield
    now, at = _shared_memory() - _shared_memory_before, time.time()
    for entry in _shared_memory_first_seen.keys() - now:
        del _shared_memory_first_seen[entry]
    for entry in now - _shared_memory_first_seen.keys():
        _shared_memory_first_seen[entry] = {"at": at, "test": request.node.nodeid}
    if at - _holders_looked_up[0] < _HOLDERS_EVERY_S:
        return
    lasting = [
        e
        for e, note in _shared_memory_first_seen.items()
        if "holders" not in note and at - note["at"] > _HOLDERS_AFTER_S
    ]
    if lasting:
        _holders_looked_up[0] = at
        for entry, holders in shared_memory_holders(lasting).items():
            _shared_memory_first_seen[entry]["holders"] = holders


def _shared_memory() -> set[str]:
    """The entries of /dev/shm, with the suite's own snapshot root replaced by what it holds."""
    if not _SHARED_MEMORY.is_dir():
        return set()
    entries = {entry.name for entry in _SHARED_MEMORY.iterdir()} - {_SNAPSHOTS.name}
    held = {f"{_SNAPSHOTS.name}/{entry.name}" for entry in _SNAPSHOTS.iterdir()} if _SNAPSHOTS.is_dir() else set()
    return entries | held


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
