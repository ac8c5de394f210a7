"""One 2-process job for benchmarks/hang_watchdog.py (run under torchrun).

``--part=overhead``: ``--rounds`` rounds of one fit per variant (no callback, ``HangWatchdog``, ``HangWatchdog`` with
``StragglerDetector``) in the same processes, the variants' order rotated every round; rank 0 writes each fit's median
step time to ``overhead.json``.

``--part=detection``: one fit with ``HangWatchdog`` and ``ResumableCheckpoint``, where rank 1 freezes (``--freeze``:
SIGSTOP, or a hang in Python) at step ``--steps // 2``; torchrun restarts the job, which resumes, and rank 0 of the
restarted attempt writes when its process started and when its first step ended to ``detection.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

PROCESS_STARTED = time.time()

import lightning.pytorch as pl  # noqa: E402

from benchmarks._common import rotated  # noqa: E402
from benchmarks._step_times import StepEnds  # noqa: E402
from examples.char_transformer import CharDataModule, CharTransformer  # noqa: E402
from lightning_scale import distributed  # noqa: E402
from lightning_scale.callbacks import HangWatchdog, ResumableCheckpoint, StragglerDetector  # noqa: E402
from lightning_scale.testing import Fault, FaultInjector  # noqa: E402

WARMUP_STEPS = 10
VARIANTS = ("none", "watchdog", "watchdog+stragglers")


def _callbacks(variant: str) -> list[pl.Callback]:
    callbacks: list[pl.Callback] = []
    if variant.startswith("watchdog"):
        callbacks.append(HangWatchdog())
    if variant.endswith("stragglers"):
        callbacks.append(StragglerDetector())
    return callbacks


def _trainer(steps: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, callbacks=callbacks, logger=False,
        limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=50,
        enable_checkpointing=any(isinstance(callback, ResumableCheckpoint) for callback in callbacks),
    )  # fmt: skip


def overhead(args: argparse.Namespace, workdir: Path) -> None:
    rounds: list[dict[str, float]] = []
    for index in range(args.rounds):
        times: dict[str, float] = {}
        for variant in rotated(VARIANTS, index):
            pl.seed_everything(0, verbose=False)
            clock = StepEnds()
            trainer = _trainer(args.steps, [clock, *_callbacks(variant)])
            trainer.fit(CharTransformer(vocab_size=64, d_model=args.d_model), datamodule=CharDataModule(batch_size=8))
            times[variant] = clock.median_step_s(WARMUP_STEPS)
        rounds.append(times)
    if int(os.environ["RANK"]) == 0:
        (workdir / "overhead.json").write_text(json.dumps(rounds))


class _FirstStep(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        resumed = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        if resumed and trainer.is_global_zero and not self.out.exists():
            self.out.write_text(json.dumps({"process_started": PROCESS_STARTED, "first_step_ended": time.time()}))


def detection(args: argparse.Namespace, workdir: Path) -> None:
    pl.seed_everything(0, verbose=False)
    callbacks = [
        FaultInjector([Fault(step=args.steps // 2, rank=1, kind=args.freeze)], record_dir=workdir),
        ResumableCheckpoint(dirpath=str(workdir / "ckpt"), every_n_train_steps=args.steps // 4),
        HangWatchdog(min_timeout_s=args.min_timeout_s),
        _FirstStep(workdir / "detection.json"),
    ]
    trainer = _trainer(args.steps, callbacks)
    trainer.fit(CharTransformer(vocab_size=64, d_model=args.d_model, n_heads=4, n_layers=4),
                datamodule=CharDataModule(batch_size=8))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=["overhead", "detection"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--freeze", choices=["SIGSTOP", "hang"], default="SIGSTOP")
    parser.add_argument("--min-timeout-s", type=float, default=10.0)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    (overhead if args.part == "overhead" else detection)(args, Path(args.workdir))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
