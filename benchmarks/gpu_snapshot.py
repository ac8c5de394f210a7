"""`make gpu-check`, memory snapshots on CUDA: one snapshot/restore cycle, checked bitwise, and the device-to-host copy.

Three runs of one process each, of a model with dropout on the device (deterministic algorithms on): the uninterrupted
run; the same run killed with SIGKILL right after the memory snapshot of step ``--kill-at``; and its restart, which
resumes from that snapshot (node-local shared memory, see ResumableCheckpoint) and must end with the uninterrupted
run's weights, bit for bit. It reports the time training waited for each snapshot (the device-to-host copy of the
state into shared memory), with the state's size. Without CUDA it says so and writes the reason; ``--device cpu`` runs
the same cycle on the CPU (a smoke run). Writes ``benchmarks/results/gpu_snapshot.json``.

    .venv/bin/python -m benchmarks.gpu_snapshot [--device cpu] [--width 256] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_snapshot.json"
STEPS, KILL_AT = 24, 13


def _train(workdir: Path, device: str, kill_at: int | None, width: int) -> None:
    """One run (in this process): fit ``STEPS`` steps, snapshots every step; save the final weights."""
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_scale.callbacks import ResumableCheckpoint

    torch.use_deterministic_algorithms(True)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.3), nn.Linear(width, width))

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    checkpoint = ResumableCheckpoint(dirpath=str(workdir / "ckpt"), every_n_train_steps=10**6, snapshot_every_n_steps=1)
    snapshot_seconds: list[float] = []

    class KillAndTime(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if kill_at is not None and trainer.global_step == kill_at + 1:
                os.kill(os.getpid(), signal.SIGKILL)  # the snapshot of step kill_at was taken a step ago
            if checkpoint.last_snapshot_seconds is not None:  # the previous step's (checkpoint callbacks run last)
                snapshot_seconds.append(checkpoint.last_snapshot_seconds)

    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(512, width), torch.randn(512, width))
    trainer = pl.Trainer(
        accelerator=device, devices=1, max_steps=STEPS, callbacks=[KillAndTime(), checkpoint], logger=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )  # fmt: skip
    trainer.fit(Model(), train_dataloaders=DataLoader(data, batch_size=64, shuffle=True))
    weights = {k: v.detach().cpu() for k, v in trainer.lightning_module.state_dict().items()}
    torch.save(weights, workdir / "final.pt")
    nbytes = sum(p.numel() * p.element_size() for p in trainer.lightning_module.parameters()) * 3  # + Adam's two
    (workdir / "timing.json").write_text(json.dumps({"snapshot_seconds": snapshot_seconds[2:], "state_bytes": nbytes}))


def _run(workdir: Path, device: str, kill_at: int | None, memory: Path, width: int) -> int:
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_snapshot",
        f"--device={device}",
        f"--worker={workdir}",
        f"--width={width}",
    ]
    command += [] if kill_at is None else [f"--kill-at={kill_at}"]
    env = {**os.environ, "LIGHTNING_SCALE_SNAPSHOT_DIR": str(memory), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    return subprocess.run(command, env=env, timeout=600, cwd=ROOT).returncode


def check(device: str, width: int) -> dict:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no CUDA device here"}
    with tempfile.TemporaryDirectory(prefix="gpu-snapshot-") as base:
        reference, job, memory = Path(base, "reference"), Path(base, "job"), Path(base, "memory")
        reference.mkdir()
        job.mkdir()
        assert _run(reference, device, None, memory, width) == 0
        assert _run(job, device, KILL_AT, memory, width) == -signal.SIGKILL
        assert _run(job, device, None, memory, width) == 0
        expected, got = torch.load(reference / "final.pt"), torch.load(job / "final.pt")
        timing = json.loads((reference / "timing.json").read_text())
        memory_left = sorted(str(p) for p in memory.rglob("*"))
    seconds = timing["snapshot_seconds"]
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "bitwise_equal": expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected),
        "state_mb": timing["state_bytes"] / 1e6,
        "snapshot_seconds_median": statistics.median(seconds),
        "snapshot_gb_per_s": timing["state_bytes"] / statistics.median(seconds) / 1e9,
        "memory_left": memory_left,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--width", type=int, default=2048, help="layer width (2048: about 100 MB of state)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _train(Path(args.worker), args.device, args.kill_at, args.width)
        return
    result = check(args.device, args.width)
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not result.get("skipped") and (not result["bitwise_equal"] or result["memory_left"]):
        raise SystemExit("the resumed run differs from the uninterrupted one, or memory was left behind")


if __name__ == "__main__":
    main()
