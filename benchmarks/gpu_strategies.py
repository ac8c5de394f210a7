"""`make gpu-check`, strategies on CUDA: each strategy at world size 1 on NCCL, an asynchronous save's device-to-host
staging, and peak memory by the CUDA allocator.

One process per strategy (``torchrun --nproc-per-node 1``, so Lightning picks NCCL on a GPU): ``ddp``,
``data_parallel`` with ZeRO-0/1/2, ``model_parallel`` (FSDP2) on the example transformer, a few steps each; it records
whether the fit ran, its median step, the allocator's peak over the steady steps (``_peak_memory.py``), and for
``data_parallel`` an asynchronous ``ResumableCheckpoint`` save: the time training was blocked (the device-to-host copy
of the state) against the state's size. Without CUDA it says so and writes the reason; ``--device cpu`` runs the
same on the CPU over gloo (a smoke run). Writes ``benchmarks/results/gpu_strategies.json``.

    .venv/bin/python -m benchmarks.gpu_strategies [--device cpu] [--d-model 512] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_strategies.json"
STEPS = 30
STRATEGIES = {
    "ddp": ("ddp", {}),
    "zero0": ("data_parallel", {}),
    "zero1": ("data_parallel", {"zero_stage": 1}),
    "zero2": ("data_parallel", {"zero_stage": 2}),
    "fsdp": ("model_parallel", {"min_params_to_shard": 1000}),
}


def _worker(name: str, device: str, d_model: int, out: Path) -> None:
    """One fit (in this process, under torchrun): its step, its peak memory, an async save's blocked time."""
    import lightning.pytorch as pl
    import torch

    from benchmarks._peak_memory import PeakMemory
    from benchmarks._step_times import StepEnds
    from examples.char_transformer import CharDataModule, CharTransformer
    from lightning_scale.callbacks import ResumableCheckpoint
    from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy

    registry, kwargs = STRATEGIES[name]
    strategy = {"data_parallel": DataParallelStrategy, "model_parallel": ModelParallelStrategy}.get(registry)
    ends, peak = StepEnds(), PeakMemory()
    checkpoint = ResumableCheckpoint(dirpath=str(out / "ckpt"), every_n_train_steps=STEPS - 5, async_save=True,
                                     snapshot_every_n_steps=None)  # fmt: skip
    callbacks: list[pl.Callback] = [ends, peak] + ([checkpoint] if registry == "data_parallel" else [])
    torch.use_deterministic_algorithms(True)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator=device, devices=1, strategy=strategy(**kwargs) if strategy else registry, max_steps=STEPS,
        callbacks=callbacks, logger=False, enable_checkpointing=registry == "data_parallel",
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(CharTransformer(d_model=d_model, dropout=0.1), datamodule=CharDataModule(batch_size=16))
    state_bytes = sum(p.numel() * p.element_size() for p in trainer.lightning_module.parameters()) * 4
    result = {
        "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
        "step_ms": ends.median_step_s(5) * 1e3,
        "peak_mb": (peak.peak_bytes or 0) / 1e6,
        "blocked_s": checkpoint.last_blocked_seconds if registry == "data_parallel" else None,
        "state_mb": state_bytes / 1e6,
    }
    (out / "result.json").write_text(json.dumps(result))


def check(device: str, d_model: int) -> dict:
    import torch

    from lightning_scale.testing import launch_command, launch_environment

    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no CUDA device here"}
    rows = {}
    for name in STRATEGIES:
        with tempfile.TemporaryDirectory(prefix="gpu-strategies-") as tmp:
            worker = [f"--worker={name}", f"--device={device}", f"--d-model={d_model}", f"--workdir={tmp}"]
            command = launch_command(["-m", "benchmarks.gpu_strategies", *worker], 1)
            env = launch_environment([ROOT], CUBLAS_WORKSPACE_CONFIG=":4096:8")  # deterministic cuBLAS
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
            result = Path(tmp, "result.json")
            rows[name] = json.loads(result.read_text()) if done.returncode == 0 and result.exists() else {
                "failed": (done.stdout + done.stderr)[-2000:]
            }  # fmt: skip
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "d_model": d_model, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.device, args.d_model, Path(args.workdir))
        return
    result = check(args.device, args.d_model)
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    failed = [name for name, row in result.get("rows", {}).items() if "failed" in row]
    if failed:
        raise SystemExit(f"strategies that failed at world size 1: {failed}")


if __name__ == "__main__":
    main()
