"""The get-started page's own check, as the page shows it: the tutorial's module and data resume bitwise exactly."""

import pytest

from examples.preemptible import NoisyPointsData, Regressor
from lightning_scale.testing import assert_exact_resume

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_my_training_resumes_exactly(tmp_path):
    assert_exact_resume(Regressor, NoisyPointsData, steps=40, interrupt_at=15, devices=2, workdir=tmp_path)
