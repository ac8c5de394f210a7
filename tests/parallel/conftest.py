"""One stock-DDP reference run shared by the strategy tests of this package."""

from __future__ import annotations

import pytest

from tests.parallel.helpers import run_job


@pytest.fixture(scope="package")
def stock_ddp(tmp_path_factory) -> dict:
    """Lightning's DDPStrategy, accumulating 2 batches per step."""
    return run_job(tmp_path_factory.mktemp("ddp"), "ddp", strategy="ddp", accumulate=2)
