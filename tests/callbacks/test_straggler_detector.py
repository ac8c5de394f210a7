"""StragglerDetector in one process: where no gradient passes through autograd's accumulation the wait cannot be
timed, and the detector says so instead of judging."""

from __future__ import annotations

import pytest
import torch

from examples.char_transformer import CharTransformer
from lightning_scale.callbacks import StragglerDetector
from tests import fitting


class HandSetGradients(CharTransformer):
    """Manual optimization that assigns every gradient itself, as FSDP2 does with its sharded ones."""

    def __init__(self) -> None:
        super().__init__(vocab_size=64)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        for parameter in self.parameters():
            parameter.grad = torch.full_like(parameter, 1e-3)
        optimizer.step()
        optimizer.zero_grad()


def test_gradients_set_by_hand_leave_the_wait_untimed_and_it_says_so(tiny_trainer_kwargs):
    detector = StragglerDetector()
    with pytest.warns(UserWarning, match="cannot be told apart from work; stragglers are not judged"):
        fitting.fit([detector], tiny_trainer_kwargs, 4, model=HandSetGradients,
                    datamodule=fitting.CharDataModule(batch_size=8), log_every_n_steps=1)  # fmt: skip
    assert not detector.measurable and detector.tally.windows == 0
    assert detector.report() == "Stragglers: not judged (the wait for other ranks cannot be timed in this fit)."


def test_a_fit_with_autograd_gradients_is_judged_every_logging_window(tiny_trainer_kwargs):
    detector = StragglerDetector()
    fitting.fit([detector], tiny_trainer_kwargs, 6, log_every_n_steps=2)
    assert detector.measurable and detector.tally.windows == 3  # one rank: never a straggler
    assert detector.report().startswith("Stragglers: none in 3 logging windows")
