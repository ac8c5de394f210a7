"""SpotPreemption in single-process runs: bad input, Lightning's SIGTERM handler replaced, the deadline decision."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.strategies import DDPStrategy

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption
from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.preemption import Notice, SignalNotice
from lightning_scale.report.wandb_offline import exit_codes, history_values, read_records
from lightning_scale.testing import CloudNotices, Fault, JobConfig, assert_same_tensors, run_attempt, write_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"check_every_n_steps": 0}, r"check_every_n_steps=0 must be >= 1"),
        ({"exit_code": 0}, r"exit_code=0 must be in 1\.\.255; 0 would tell the orchestrator 'finished'"),
        ({"exit_code": 256}, r"exit_code=256 must be in 1\.\.255"),
        ({"max_slurm_requeues": -1}, r"max_slurm_requeues=-1 must be >= 0 \(0: never requeue\), or None for no limit"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpotPreemption(**kwargs)


def test_a_source_that_is_not_a_notice_source_is_refused():
    with pytest.raises(TypeError, match=r"not notice sources"):
        SpotPreemption(sources=["SIGTERM"])


def test_without_a_resumable_checkpoint_fit_fails_before_training(tiny_trainer_kwargs):
    trainer = Trainer(max_steps=2, callbacks=[SpotPreemption()], **tiny_trainer_kwargs)
    with pytest.raises(
        ValueError, match=r"needs a ResumableCheckpoint.*ResumableCheckpoint\(dirpath=\.\.\., every_n_train_steps"
    ):
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert trainer.global_step == 0


class HandlerProbe(Callback):
    def __init__(self) -> None:
        self.sanity: list = []
        self.training: list = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            self.sanity.append(signal.getsignal(signal.SIGTERM))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.training.append(signal.getsignal(signal.SIGTERM))


def test_replaces_lightnings_sigterm_handler_from_the_sanity_check_on_and_restores_it(tmp_path, tiny_trainer_kwargs):
    before = signal.getsignal(signal.SIGTERM)
    source, probe = SignalNotice(), HandlerProbe()
    callbacks = [ResumableCheckpoint(dirpath=str(tmp_path / "ckpt")), SpotPreemption([source]), probe]
    seed_everything(0)
    kwargs = {**tiny_trainer_kwargs, "limit_val_batches": 2, "num_sanity_val_steps": 2}
    Trainer(max_steps=3, callbacks=callbacks, **kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    # Lightning's handler runs a collective inside the handler: it must never be the one installed while fitting
    assert probe.sanity == [source._handle] * 2 and probe.training == [source._handle] * 3
    assert signal.getsignal(signal.SIGTERM) == before


class BroadcastProbe(Callback):
    """Whether the training loop's per-step SIGTERM broadcast is Lightning's own method at each batch."""

    def __init__(self) -> None:
        self.lightnings: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lightnings.append("_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop))


@pytest.mark.parametrize(("signals", "skipped"), [(("SIGTERM", "SIGUSR1"), True), (("SIGUSR1",), False)])
def test_lightnings_per_step_sigterm_broadcast_is_skipped_only_while_ours_holds_sigterm(
    tmp_path, tiny_trainer_kwargs, signals, skipped
):
    probe = BroadcastProbe()
    callbacks = [ResumableCheckpoint(dirpath=str(tmp_path / "ckpt")), SpotPreemption([SignalNotice(signals)]), probe]
    seed_everything(0)
    trainer = Trainer(max_steps=3, callbacks=callbacks, **tiny_trainer_kwargs)
    trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert probe.lightnings == [not skipped] * 3
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)  # Lightning's again after fit


class SlurmRequeueProbe(Callback):
    """The SLURM environment's ``auto_requeue`` and the SIGUSR1 handler at each batch."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, object]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        environment = trainer.strategy.cluster_environment
        self.seen.append((environment.auto_requeue, signal.getsignal(signal.SIGUSR1)))


@pytest.mark.parametrize("slurm_requeue", [True, False])
def test_lightnings_own_slurm_auto_requeue_is_off_while_ours_requeues(
    tmp_path, tiny_trainer_kwargs, monkeypatch, slurm_requeue
):
    """Lightning's handlers would save ``hpc_ckpt_*`` files and requeue the job a second time."""
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                        "SLURM_NODEID": "0", "SLURM_JOB_NAME": "train"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    environment, probe = SLURMEnvironment(), SlurmRequeueProbe()
    before = signal.getsignal(signal.SIGUSR1)
    # SIGTERM only: our handler does not hide whether Lightning installed its SIGUSR1 handler
    preemption = SpotPreemption([SignalNotice(["SIGTERM"])], slurm_requeue=slurm_requeue)
    callbacks = [ResumableCheckpoint(dirpath=str(tmp_path / "ckpt")), preemption, probe]
    kwargs = {**tiny_trainer_kwargs, "strategy": DDPStrategy(cluster_environment=environment)}
    Trainer(max_steps=2, callbacks=callbacks, **kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    if slurm_requeue:
        assert probe.seen == [(False, before)] * 2
    else:
        assert [auto for auto, _ in probe.seen] == [True] * 2 and all(h != before for _, h in probe.seen)
    assert environment.auto_requeue and signal.getsignal(signal.SIGUSR1) == before  # as they were after fit


def test_saves_only_when_the_last_save_fits_before_the_deadline(tmp_path):
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path))
    preemption = SpotPreemption()
    preemption._checkpoint = checkpoint
    soon = Notice("SIGTERM", received_unix=0.0, deadline_unix=10.0)
    assert preemption._can_save_in_time(Notice("SIGTERM", 0.0, float("inf")))  # never measured: try
    checkpoint.last_save_seconds = 2.0
    assert preemption._can_save_in_time(Notice("SIGTERM", 0.0, soon.deadline_unix + 1e10))
    assert not preemption._can_save_in_time(soon)  # the deadline has passed


def single_process_job(tmp_path: Path, grace_seconds: float, **extra) -> Path:
    fields = {
        "model_factory": "tests.factories:model",
        "datamodule_factory": "tests.factories:data_workers0",
        "trainer_kwargs": {"limit_val_batches": 0},
        "faults": (Fault(step=6, rank=0, kind="SIGTERM"),),
        **extra,
    }
    config = JobConfig(
        steps=20,
        checkpoint_every=4,
        devices=1,
        trace_params=False,
        spot_preemption=CloudNotices(grace_seconds=grace_seconds),
        **fields,
    )
    return write_job(tmp_path, config)


@pytest.mark.timeout(120)
def test_sigterm_saves_at_the_next_step_and_exits_143(tmp_path):
    job = single_process_job(tmp_path, grace_seconds=25)
    assert run_attempt(job, 100, expect="failure") == 143
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "checkpoints")))
    assert manifest is not None and manifest.global_step == 7


@pytest.mark.timeout(120)
def test_too_little_time_keeps_the_previous_checkpoint_and_still_exits_cleanly(tmp_path):
    job = single_process_job(tmp_path, grace_seconds=1e-6)
    assert run_attempt(job, 100, expect="failure") == 143
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    manifest, skipped = find_newest_valid(store)
    assert manifest is not None and manifest.global_step == 4 and skipped == []
    assert "too little time, NOT saving" in (tmp_path / "log.txt").read_text()


@pytest.mark.timeout(180)
def test_a_notice_during_validation_at_a_saved_step_is_kept_for_the_resumed_run(tmp_path):
    """Validation at step 4 runs after step 4's own checkpoint (``val_check_interval`` and ``checkpoint_every`` alike,
    as in the shipped configs): the notice seen there saves the step again, with the notice in it, so the resumed run
    says why it stopped (the Slurm time-limit test once resumed without that line)."""
    extra = {"trainer_kwargs": {"val_check_interval": 4, "limit_val_batches": 2}}
    job = single_process_job(tmp_path, 25, faults=(Fault(step=4, rank=0, kind="SIGTERM", val_batch=1),), **extra)
    assert run_attempt(job, 100, expect="failure") == 143
    assert "Preempted at step 4 (SIGTERM)" in (tmp_path / "log.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["epoch=0-step=4.ckpt"]  # replaced
    run_attempt(job, 100, expect="finish")
    assert "Resumed after a preemption: SIGTERM notice, checkpointed at step 4" in (tmp_path / "log.txt").read_text()


@pytest.mark.timeout(120)
def test_a_wandb_offline_run_is_finished_with_the_preemption_before_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    job = single_process_job(tmp_path, grace_seconds=25, wandb_dir=str(tmp_path / "wandb-runs"))
    assert run_attempt(job, 100, expect="failure") == 143
    runs = list((tmp_path / "wandb-runs").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    records = read_records(runs[0])
    assert history_values(records, "preemption/step") == ["7"] and history_values(records, "preemption/saved") == ["1"]
    assert all(history_values(records, key) for key in SpotPreemption.METRIC_KEYS)  # the documented keys are logged
    assert exit_codes(records) == [143]  # finished before os._exit: the run file is complete
    assert any(r.WhichOneof("record_type") == "preempting" for r in records)


@pytest.mark.timeout(120)
def test_inside_slurm_rank0_requeues_the_job_after_the_checkpoint(tmp_path, monkeypatch):
    # A stand-in `scontrol` on PATH records how it is called (tests/slurm runs the real one, on a real cluster).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    job = single_process_job(tmp_path / "job", grace_seconds=25)
    assert run_attempt(job, 100, expect="failure") == 143
    assert calls.read_text().split() == ["requeue", "4242"]
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is not None and manifest.global_step == 7


@pytest.mark.parametrize(
    ("restarts", "limit", "stderr", "said"),
    [
        ("0", 20, "", "Requeueing SLURM job 4242 (requeue 1 of at most 20)"),
        ("2", None, "", "Requeueing SLURM job 4242 (requeue 3);"),
        ("3", 3, "", "Not requeueing SLURM job 4242: it was requeued 3 times already (max_slurm_requeues=3)"),
        ("0", 20, "Job is pending execution for job 4242", "SLURM job 4242 was back in the queue already."),
        ("0", 20, "Invalid job id specified", "`scontrol requeue 4242` failed (exit code 1: Invalid job id"),
    ],
)
def test_the_requeue_says_what_it_did_and_stops_at_the_cap(
    tmp_path, monkeypatch, caplog, restarts, limit, stderr, said
):
    """``scontrol``'s answers as Slurm 22.05 gives them (tests/slurm meets the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    status = 1 if stderr else 0
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "{stderr}" >&2\nexit {status}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
    with caplog.at_level("INFO"):
        SpotPreemption(max_slurm_requeues=limit)._requeue_on_slurm()
    assert said in caplog.text
    assert calls.exists() == ("Not requeueing" not in said)


@pytest.mark.timeout(180)
def test_with_gradient_accumulation_it_stops_after_an_optimizer_step_and_resumes_exactly(tmp_path):
    kwargs = {"limit_val_batches": 0, "accumulate_grad_batches": 4}
    reference = single_process_job(tmp_path / "reference", grace_seconds=25, trainer_kwargs=kwargs, faults=())
    run_attempt(reference, 100, expect="finish")
    job = single_process_job(tmp_path / "job", grace_seconds=25, trainer_kwargs=kwargs)  # SIGTERM during step 7
    assert run_attempt(job, 100, expect="failure") == 143
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is not None and manifest.global_step == 7  # not in the middle of the accumulation window
    run_attempt(job, 100, expect="finish")
    resumed = torch.load(tmp_path / "job" / "final_rank0.pt", weights_only=True)
    expected = torch.load(tmp_path / "reference" / "final_rank0.pt", weights_only=True)
    assert_same_tensors(resumed, expected, "weights")


@pytest.mark.timeout(180)
def test_a_sigterm_to_every_process_of_the_job_saves_at_the_next_step_and_resumes_exactly(tmp_path):
    """As SLURM signals every process of a job step: the rank and its train and validation loaders' workers get
    SIGTERM from another process. The workers outlive it until the rank saved and stopped them (without the shield,
    torch's workers die of it and the rank fails at once: "DataLoader worker (pid N) is killed by signal")."""
    extra = {"trainer_kwargs": {"limit_val_batches": 2, "val_check_interval": 5}}
    extra["datamodule_factory"] = "tests.factories:data_workers2_fork"
    reference = single_process_job(tmp_path / "reference", grace_seconds=25, faults=(), **extra)
    run_attempt(reference, 100, expect="finish")
    faults = (Fault(step=6, rank=0, kind="SIGTERM", whole_job=True),)  # during step 7, after a validation
    job = single_process_job(tmp_path / "job", grace_seconds=25, faults=faults, **extra)
    assert run_attempt(job, 100, expect="failure") == 143
    log = (tmp_path / "job" / "log.txt").read_text()
    assert log.count("ignores SIGTERM from pid") == 4 and "killed by signal" not in log  # 2 train + 2 val workers
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is not None and manifest.global_step == 7
    run_attempt(job, 100, expect="finish")
    resumed = torch.load(tmp_path / "job" / "final_rank0.pt", weights_only=True)
    expected = torch.load(tmp_path / "reference" / "final_rank0.pt", weights_only=True)
    assert_same_tensors(resumed, expected, "weights")
