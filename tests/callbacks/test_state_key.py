"""Our callbacks' state keys: Lightning's own for the same settings, formatted once, and following a changed setting
(Lightning asks for the key at every hook call: lightning_scale/callbacks/_state_key.py)."""

from __future__ import annotations

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_scale.callbacks import BudgetedEarlyStopping, DivergenceRollback, ResumableCheckpoint, SpotPreemption


def counting(cls: type) -> type:
    class Counting(cls):  # type: ignore[misc, valid-type]
        formatted = 0

        def _generate_state_key(self, **kwargs: object) -> str:
            type(self).formatted += 1
            return super()._generate_state_key(**kwargs)

    Counting.__qualname__ = cls.__qualname__  # the key starts with the class's name
    return Counting


def test_the_checkpoint_key_is_model_checkpoints_and_follows_its_settings(tmp_path):
    checkpoint = counting(ResumableCheckpoint)(dirpath=str(tmp_path), every_n_train_steps=5)
    keys = {checkpoint.state_key for _ in range(100)}
    assert type(checkpoint).formatted == 1 and keys == {ModelCheckpoint.state_key.fget(checkpoint)}
    assert keys == {"ResumableCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 5, "
                    "'every_n_epochs': 0, 'train_time_interval': None}"}  # fmt: skip
    checkpoint.monitor = "val_loss"
    assert "'monitor': 'val_loss'" in checkpoint.state_key and type(checkpoint).formatted == 3
    timed = ResumableCheckpoint(dirpath=str(tmp_path), every_n_minutes=2.0)
    for changed in (checkpoint, timed):
        assert changed.state_key == ModelCheckpoint.state_key.fget(changed)


@pytest.mark.parametrize(
    ("cls", "kwargs", "setting", "value", "expected"),
    [
        (SpotPreemption, {}, "check_every_n_steps", 4, "SpotPreemption{'check_every_n_steps': 4}"),
        (BudgetedEarlyStopping, {"monitor": "val_loss", "max_cost_usd": 1.0}, "mode", "max",
         "BudgetedEarlyStopping{'monitor': 'val_loss', 'mode': 'max', 'budget': True}"),
        (DivergenceRollback, {}, "spike_factor", 8.0, "DivergenceRollback{'spike_factor': 8.0}"),
    ],
)  # fmt: skip
def test_our_settings_keys_are_formatted_once_and_follow_a_changed_setting(cls, kwargs, setting, value, expected):
    callback = counting(cls)(**kwargs)
    before = {callback.state_key for _ in range(100)}
    assert len(before) == 1 and type(callback).formatted == 1
    setattr(callback, setting, value)
    assert callback.state_key == expected and callback.state_key not in before and type(callback).formatted == 2
