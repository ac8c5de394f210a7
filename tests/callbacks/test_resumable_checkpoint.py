"""ResumableCheckpoint in single-process fits: triggers, atomic files, retention, auto-resume and bad input."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import knobs
from lightning_scale.callbacks import CostTracker, DataStateCheckpoint, ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStorageError, CheckpointStore, find_newest_valid
from lightning_scale.checkpoint.progress import PROGRESS_NAME, ProgressMarker
from lightning_scale.errors import UsageError
from tests import fitting
from tests.fitting import FirstStep


def fit(dirpath, trainer_kwargs, max_steps, ckpt_path=None, d_model=32, extra_callbacks=(), **checkpoint_kwargs):
    checkpoint = ResumableCheckpoint(dirpath=str(dirpath), **checkpoint_kwargs)
    first = FirstStep()
    model = lambda: CharTransformer(vocab_size=64, d_model=d_model)  # noqa: E731
    data = CharDataModule(batch_size=8, augment=True)
    trainer = fitting.fit(
        [checkpoint, first, *extra_callbacks],
        trainer_kwargs,
        max_steps,
        ckpt_path=ckpt_path,
        model=model,
        datamodule=data,
    )
    return trainer, trainer.lightning_module, checkpoint, first.first_step


def ckpt_names(dirpath: Path) -> list[str]:
    return sorted(p.name for p in dirpath.iterdir() if p.name.endswith(".ckpt"))


def digests(dirpath: Path) -> dict[str, str]:
    """Every checkpoint file and manifest (not the run's journal, which records each attempt)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dirpath.iterdir()) if p.is_file()}


def test_saves_every_n_train_steps_with_a_valid_manifest_each(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=12, every_n_train_steps=5, keep_last_k=None)
    assert ckpt_names(tmp_path) == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt"]
    store = CheckpointStore(str(tmp_path))
    manifest, skipped = find_newest_valid(store)
    assert manifest is not None and manifest.global_step == 10 and skipped == []
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or ".tmp-" in p.name]


def test_keep_last_k_keeps_the_newest_checkpoints(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=2, keep_last_k=2)
    assert ckpt_names(tmp_path) == ["epoch=0-step=10.ckpt", "epoch=0-step=8.ckpt"]
    assert sorted(p.name for p in tmp_path.glob("*.manifest.json")) == [
        "epoch=0-step=10.ckpt.manifest.json",
        "epoch=0-step=8.ckpt.manifest.json",
    ]


def test_retention_never_touches_another_runs_checkpoints(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=4, every_n_train_steps=2, keep_last_k=1, filename="a-{step}")
    fit(tmp_path, tiny_trainer_kwargs, max_steps=6, every_n_train_steps=2, keep_last_k=1, auto_resume=False)
    assert ckpt_names(tmp_path) == ["a-step=4.ckpt", "epoch=0-step=6.ckpt"]


def test_auto_resume_continues_bitwise_exactly(tmp_path, tiny_trainer_kwargs):
    _, reference, _, _ = fit(tmp_path / "reference", tiny_trainer_kwargs, max_steps=20, every_n_train_steps=10)
    fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=10, every_n_train_steps=5)
    trainer, resumed, _, first_step = fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=20, every_n_train_steps=5)
    assert first_step == 10 and trainer.global_step == 20
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_truncated_newest_checkpoint_falls_back_to_previous_with_a_warning(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=5)
    newest = tmp_path / "epoch=0-step=10.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])
    with pytest.warns(UserWarning, match=r"step=10\.ckpt: size is 1000 bytes"):
        _, _, _, first_step = fit(tmp_path, tiny_trainer_kwargs, max_steps=12, every_n_train_steps=5)
    assert first_step == 5
    assert newest.stat().st_size == 1000  # the bad file is reported, never deleted or overwritten


def test_no_checkpoint_means_a_fresh_start(tmp_path, tiny_trainer_kwargs):
    _, _, _, first_step = fit(tmp_path / "empty", tiny_trainer_kwargs, max_steps=3, every_n_train_steps=5)
    assert first_step == 0


def test_checkpoint_of_a_different_model_is_refused_and_left_intact(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=5, every_n_train_steps=5)
    before = digests(tmp_path)
    with pytest.raises(ValueError, match=r"different model .*shape \[144, 48\] here but \[96, 32\].*new dirpath"):
        fit(tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=5, d_model=48)
    assert digests(tmp_path) == before


def test_unwritable_dirpath_fails_before_training(tmp_path, tiny_trainer_kwargs):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    first = FirstStep()
    with pytest.raises(CheckpointStorageError, match=r"Cannot write checkpoints to dirpath=.*a-file/sub"):
        fit(blocker / "sub", tiny_trainer_kwargs, max_steps=5, every_n_train_steps=5, extra_callbacks=[first])
    assert first.first_step is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_minutes": 0}, r"every_n_minutes=0 must be > 0"),
        ({"every_n_minutes": -1.5}, r"every_n_minutes=-1.5 must be > 0"),
        ({"keep_last_k": 0}, r"keep_last_k=0 must be >= 1"),
        ({"filename": "a/{step}"}, r"must not contain '/'"),
        ({"every_n_minutes": "auto"}, r"every_n_minutes='auto' and mean_time_between_interruptions_hours go together"),
        ({"mean_time_between_interruptions_hours": 6}, r"go together"),
        ({"every_n_minutes": "auto", "mean_time_between_interruptions_hours": 0}, r"hours=0 must be > 0"),
        ({"every_n_train_steps": -5}, r"every_n_train_steps=-5 must be >= 1, or 0"),
        ({"every_n_epochs": -1}, r"every_n_epochs=-1 must be >= 1, or 0"),
        ({"dirpath": ""}, r"dirpath='' names no directory"),
        ({"dirpath": "foo://bucket/run"}, r"Cannot open dirpath='foo://bucket/run': Protocol not known: foo"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(UsageError, match=message):  # one line from the command, exit 2
        ResumableCheckpoint(**{"dirpath": "unused", **kwargs})


def test_a_cadence_that_never_saves_is_warned_about():
    with pytest.warns(UserWarning, match=r"every_n_train_steps=0, every_n_epochs=None\) saves no checkpoint"):
        ResumableCheckpoint(dirpath="unused", every_n_train_steps=0)


class AdvanceClock(Callback):
    """Moves a fake clock 30 s forward at each batch."""

    def __init__(self) -> None:
        self.now = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.now += 30.0


def test_every_n_minutes_saves_on_wall_time(tmp_path, tiny_trainer_kwargs):
    clock = AdvanceClock()
    seed_everything(0)
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path), every_n_minutes=1, keep_last_k=None)
    checkpoint._clock = lambda: clock.now
    trainer = Trainer(max_steps=7, callbacks=[clock, checkpoint], **tiny_trainer_kwargs)
    trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert ckpt_names(tmp_path) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt"]


class SlowSaves(Callback):
    """Each save costs ``seconds`` on the fake clock (it runs while the checkpoint is being built)."""

    def __init__(self, clock: AdvanceClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.clock.now += self.seconds


def test_auto_cadence_saves_at_the_young_daly_interval_of_the_measured_save_cost(tmp_path, tiny_trainer_kwargs):
    clock = AdvanceClock()  # 30 s per step
    mtbi_hours = 90.0**2 / (2 * 4.0) / 3600  # with 4 s saves, sqrt(2 C M) = 90 s = 3 steps
    checkpoint = ResumableCheckpoint(
        dirpath=str(tmp_path),
        every_n_minutes="auto",
        mean_time_between_interruptions_hours=mtbi_hours,
        keep_last_k=None,
    )
    checkpoint._clock = lambda: clock.now
    seed_everything(0)
    trainer = Trainer(max_steps=14, callbacks=[clock, SlowSaves(clock, 4.0), checkpoint], log_every_n_steps=1,
                      **tiny_trainer_kwargs)  # fmt: skip
    trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    # the first save waits for the assumed 10 s cost (sqrt(2 * 10 * M) = 142 s, step 5); then every 90 s (3 steps)
    assert set(ckpt_names(tmp_path)) == {f"epoch=0-step={s}.ckpt" for s in (5, 8, 11, 14)}
    assert checkpoint.last_save_seconds == 4.0
    assert float(trainer.callback_metrics["checkpoint/interval_minutes"]) == pytest.approx(1.5, rel=0.05)
    assert float(trainer.callback_metrics["checkpoint/save_seconds"]) == 4.0


def test_ckpt_path_last_picks_the_newest_valid_checkpoint(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=5)
    (tmp_path / "epoch=0-step=10.ckpt").write_bytes(b"corrupt")
    with pytest.warns(UserWarning, match=r"step=10\.ckpt"):
        _, _, _, first_step = fit(
            tmp_path, tiny_trainer_kwargs, max_steps=12, every_n_train_steps=5, auto_resume=False, ckpt_path="last"
        )
    assert first_step == 5


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"", "EOFError: it ends early"), (bytes(range(256)) * 8, "UnpicklingError: it does not unpickle")],
    ids=["empty", "random-bytes"],
)
def test_a_damaged_ckpt_path_is_named_in_one_line_and_the_directory_left_as_it_was(
    tmp_path, tiny_trainer_kwargs, content, says
):
    damaged = tmp_path / "given.ckpt"
    damaged.write_bytes(content)
    with pytest.raises(UsageError, match=rf"{re.escape(str(damaged))} cannot be read \({says}\): the checkpoint is"):
        fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=4, every_n_train_steps=2, ckpt_path=str(damaged))
    assert damaged.read_bytes() == content
    assert not (tmp_path / "run").exists() or ckpt_names(tmp_path / "run") == []  # refused before any training


def test_monitor_keeps_the_best_k_like_model_checkpoint(tmp_path, tiny_trainer_kwargs):
    _, _, checkpoint, _ = fit(
        tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=2, monitor="train_loss", save_top_k=2
    )
    assert len(ckpt_names(tmp_path)) == 2
    assert Path(checkpoint.best_model_path).name in ckpt_names(tmp_path)
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert manifest is not None


def test_fsspec_memory_url_saves_and_resumes(tiny_trainer_kwargs):
    url = f"memory://ckpt-{uuid.uuid4().hex}"
    fit(url, tiny_trainer_kwargs, max_steps=6, every_n_train_steps=3)
    _, _, _, first_step = fit(url, tiny_trainer_kwargs, max_steps=9, every_n_train_steps=3)
    assert first_step == 6


def test_adds_one_data_state_callback_unless_the_user_gave_one(tmp_path, tiny_trainer_kwargs):
    trainer, *_ = fit(tmp_path / "a", tiny_trainer_kwargs, max_steps=2, every_n_train_steps=2)
    assert sum(isinstance(cb, DataStateCheckpoint) for cb in trainer.callbacks) == 1
    own = DataStateCheckpoint()
    trainer, *_ = fit(tmp_path / "b", tiny_trainer_kwargs, max_steps=2, every_n_train_steps=2, extra_callbacks=[own])
    assert [cb for cb in trainer.callbacks if isinstance(cb, DataStateCheckpoint)] == [own]


def test_failed_save_raises_and_keeps_earlier_checkpoints(tmp_path, tiny_trainer_kwargs, monkeypatch):
    original = CheckpointStore.publish
    calls = []

    def publish_then_fail(self, temporary, name):
        calls.append(name)
        if name.startswith("epoch=0-step=4"):
            raise OSError("disk full (injected)")
        original(self, temporary, name)

    monkeypatch.setattr(CheckpointStore, "publish", publish_then_fail)
    with pytest.raises(CheckpointStorageError, match=r"step=4\.ckpt failed .*OSError: disk full.*untouched"):
        fit(tmp_path, tiny_trainer_kwargs, max_steps=6, every_n_train_steps=2, keep_last_k=1)
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert manifest is not None and manifest.name == "epoch=0-step=2.ckpt"


def test_a_second_fit_on_the_same_trainer_continues_instead_of_rewinding(tmp_path, tiny_trainer_kwargs):
    seed_everything(0)
    first = FirstStep()
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path), every_n_train_steps=4)
    trainer = Trainer(max_steps=5, callbacks=[checkpoint, first], **tiny_trainer_kwargs)
    model, data = CharTransformer(vocab_size=64), CharDataModule(batch_size=8)
    trainer.fit(model, datamodule=data)
    trainer.fit_loop.epoch_loop.max_steps = 7
    trainer.fit(model, datamodule=data)
    assert first.first_step == 5 and trainer.global_step == 7  # not back to the step-4 checkpoint


def test_resuming_an_older_checkpoint_starts_a_generation_that_wins_the_next_auto_resume(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, every_n_train_steps=5)
    older = str(tmp_path / "epoch=0-step=5.ckpt")
    with pytest.warns(UserWarning, match=r"newer than the state this fit starts from \(epoch=0-step=10\.ckpt\)"):
        _, _, _, first_step = fit(tmp_path, tiny_trainer_kwargs, max_steps=8, every_n_train_steps=4, ckpt_path=older)
    assert first_step == 5 and (tmp_path / "epoch=0-step=10.ckpt").exists()  # superseded, not deleted
    _, _, _, first_step = fit(tmp_path, tiny_trainer_kwargs, max_steps=9, every_n_train_steps=4)
    assert first_step == 8  # the rolled-back line of work, not the abandoned step 10


def test_save_last_is_published_with_a_manifest_and_not_counted_by_keep_last_k(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=8, every_n_train_steps=2, keep_last_k=2, save_last=True)
    assert ckpt_names(tmp_path) == ["epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"]
    manifest, skipped = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert manifest is not None and manifest.global_step == 8 and skipped == []
    assert not [p for p in tmp_path.iterdir() if ".previous" in p.name or ".partial" in p.name]


def test_validate_after_fit_with_the_callbacks_present_works(tmp_path, tiny_trainer_kwargs):
    _, model, checkpoint, _ = fit(tmp_path, tiny_trainer_kwargs, max_steps=4, every_n_train_steps=2)
    kwargs = {**tiny_trainer_kwargs, "limit_val_batches": 2}
    [metrics] = Trainer(callbacks=[ResumableCheckpoint(dirpath=str(tmp_path))], **kwargs).validate(
        model, datamodule=CharDataModule(batch_size=8), ckpt_path=checkpoint.best_model_path
    )
    assert metrics["val_loss"] > 0


def test_a_resumed_fit_prints_a_banner_with_the_steps_lost_and_the_cost_so_far(
    tmp_path, tiny_trainer_kwargs, monkeypatch, caplog
):
    monkeypatch.setattr(knobs, "PROGRESS_EVERY_S", 0.0)  # the marker follows every step
    fit(tmp_path, tiny_trainer_kwargs, max_steps=12, every_n_train_steps=5, extra_callbacks=[CostTracker(3600.0)])
    assert ProgressMarker(CheckpointStore(str(tmp_path))).last_step() == 12  # checkpoints at 5 and 10 only
    with caplog.at_level("INFO"):
        fit(tmp_path, tiny_trainer_kwargs, max_steps=15, every_n_train_steps=5, extra_callbacks=[CostTracker(3600.0)])
    banner = re.search(
        r"Auto-resuming from (\S+) \(global step 10, epoch 0, written [\d.]+ s ago\)\.\n(.*)\n(.*)", caplog.text
    )
    assert banner is not None, caplog.text
    assert banner.group(1) == str(tmp_path / "epoch=0-step=10.ckpt")
    assert banner.group(2) == "  Steps lost: 2 (the previous attempt ended at step 12)."  # it ended by itself
    assert re.fullmatch(
        r"  Cost so far: \$[\d.]+, including a restart gap of [\d.]+ s billed as preemption waste\.", banner.group(3)
    )


def test_without_a_progress_record_the_steps_lost_are_unknown(tmp_path, tiny_trainer_kwargs, caplog):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=5, every_n_train_steps=5)
    (tmp_path / PROGRESS_NAME).unlink()
    with caplog.at_level("INFO"):
        fit(tmp_path, tiny_trainer_kwargs, max_steps=6, every_n_train_steps=5)
    assert "  Steps lost: unknown (no progress record)." in caplog.text
    assert "Cost so far" not in caplog.text  # no CostTracker


USER_SCRIPT = """
import atexit, sys
import torch.distributed as dist

atexit.register(lambda: print("group at exit:", dist.is_initialized(), flush=True))  # runs after the package's
from lightning.pytorch import Trainer
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import ResumableCheckpoint

checkpoint = ResumableCheckpoint(dirpath=sys.argv[1], snapshot_every_n_steps=None)
trainer = Trainer(accelerator="cpu", devices=1, strategy="ddp", max_steps=1, limit_val_batches=0, logger=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint])
if sys.argv[2] == "own-teardown":  # a script's own teardown at exit runs first, with the group still there
    atexit.register(dist.destroy_process_group)
trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
print("group after fit:", dist.is_initialized(), flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["plain", "own-teardown"])
def test_a_users_own_script_ends_with_its_process_group_torn_down_before_the_interpreter(tmp_path, script):
    """Lightning leaves the gloo group alive after fit; torn down during the interpreter's own teardown it can abort
    the finished process (exit -6, "terminate called without an active exception"), which torchrun reports as a
    failure. ResumableCheckpoint has it torn down at exit, while the interpreter is whole, after the script's own exit
    functions: one that tears the group down itself meets no error."""
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-c", USER_SCRIPT, str(tmp_path / "ckpt"), script]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "group after fit: True" in done.stdout and "group at exit: False" in done.stdout, done.stdout[-2000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]


def test_after_a_kill_the_steps_lost_are_a_lower_bound(tmp_path, tiny_trainer_kwargs, caplog):
    """A killed attempt cannot record its last step: the banner says what it knows, not that nothing was lost."""
    fit(tmp_path, tiny_trainer_kwargs, max_steps=12, every_n_train_steps=5)
    store = CheckpointStore(str(tmp_path))
    assert ProgressMarker(store).last_record() == (12, True)  # ended by itself
    store.write_bytes(PROGRESS_NAME, b'{"global_step": 11, "unix": 0, "final": false}')  # as a SIGKILL leaves it
    with caplog.at_level("INFO"):
        fit(tmp_path, tiny_trainer_kwargs, max_steps=15, every_n_train_steps=5)
    assert "  Steps lost: at least 1 (the previous attempt was last recorded at step 11)." in caplog.text
