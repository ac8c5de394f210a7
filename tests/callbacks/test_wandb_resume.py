"""WandbResume: a resumed fit continues the W&B run of the checkpoint instead of starting another."""

from __future__ import annotations

from lightning.pytorch.loggers import WandbLogger

from lightning_scale.callbacks import ResumableCheckpoint, WandbResume
from tests import fitting


def fit_with_wandb(tmp_path, tiny_trainer_kwargs, max_steps, **checkpoint_kwargs):
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="resume")
    checkpoint = ResumableCheckpoint(str(tmp_path / "ckpt"), every_n_train_steps=2, **checkpoint_kwargs)
    try:
        return fitting.fit([checkpoint], tiny_trainer_kwargs, max_steps, logger=logger), logger.version
    finally:
        logger.experiment.finish()


def run_dirs(tmp_path):
    return sorted(path.name for path in (tmp_path / "wandb").glob("offline-run-*"))


def test_a_resumed_fit_continues_the_same_run_and_leaves_no_empty_one(tmp_path, tiny_trainer_kwargs):
    trainer, first_id = fit_with_wandb(tmp_path, tiny_trainer_kwargs, max_steps=4)
    assert any(isinstance(cb, WandbResume) for cb in trainer.callbacks)  # added by ResumableCheckpoint
    trainer, resumed_id = fit_with_wandb(tmp_path, tiny_trainer_kwargs, max_steps=6)
    assert trainer.global_step == 6 and resumed_id == first_id
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 2 and all(first_id in name for name in dirs), dirs  # the fresh run's directory is gone


def test_switched_off_each_attempt_is_a_run_of_its_own(tmp_path, tiny_trainer_kwargs):
    _, first_id = fit_with_wandb(tmp_path, tiny_trainer_kwargs, max_steps=4, wandb_resume=False)
    _, second_id = fit_with_wandb(tmp_path, tiny_trainer_kwargs, max_steps=6, wandb_resume=False)
    assert first_id != second_id
