"""Shared fixtures: every test leaves environment variables, signal handlers and the process group as it found them."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_scale import knobs
from lightning_scale._warnings import ignore_library_warnings
from tests.faulty_fs import FaultyFileSystem

pytest_plugins = ["tests.s3"]  # the S3 server fixtures

_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]


def pytest_configure(config: pytest.Config) -> None:
    # pytest restores the warning filters it saw at start-up around every collection and test, so the filters that
    # importing lightning_scale installs (during collection) would not last: install them first, as a user's run has
    ignore_library_warnings()


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
