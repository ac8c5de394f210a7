"""``assert_exact_resume``: check that YOUR LightningModule and DataModule resume bitwise exactly."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from lightning_scale.testing.processes import kill_process_tree

__all__ = ["ResumeReport", "assert_exact_resume", "run_interrupted_and_reference"]


_RUNNER_TRAINER_ARGS = {
    "accelerator", "devices", "strategy", "max_steps", "callbacks", "logger", "enable_progress_bar",
    "enable_model_summary",
}  # fmt: skip


@dataclasses.dataclass
class ResumeReport:
    """What the uninterrupted and the interrupted-then-resumed runs did, rank by rank.

    Attributes:
        reference: Per rank, one record per training step of the uninterrupted run.
        resumed: The same for the interrupted run, its first attempt followed by its resumed attempt.
        reference_weights: Rank 0's final ``state_dict`` of the uninterrupted run.
        resumed_weights: Rank 0's final ``state_dict`` of the interrupted run.
        workdir: Where the checkpoints, traces and logs of both runs are.
    """

    reference: dict[int, list[dict[str, Any]]]
    resumed: dict[int, list[dict[str, Any]]]
    reference_weights: dict[str, torch.Tensor]
    resumed_weights: dict[str, torch.Tensor]
    workdir: Path

    def first_divergence(self) -> str | None:
        """The first step, rank and tensor where the runs differ, or ``None`` when they are identical."""
        for rank in sorted(self.reference):
            ref, res = self.reference[rank], self.resumed.get(rank, [])
            for ref_rec, res_rec in zip(ref, res, strict=False):
                problem = _record_difference(ref_rec, res_rec)
                if problem:
                    return f"step {ref_rec['step']}, rank {rank}: {problem}"
            if len(ref) != len(res):
                return f"rank {rank}: the uninterrupted run took {len(ref)} steps, the resumed run {len(res)}"
        for name, tensor in self.reference_weights.items():
            other = self.resumed_weights.get(name)
            if other is None or not torch.equal(tensor, other):
                diff = "missing" if other is None else f"max |diff| {(tensor.float() - other.float()).abs().max():.3g}"
                return f"final weights, rank 0: tensor {name!r} differs ({diff})"
        return None


def _record_difference(ref: dict[str, Any], res: dict[str, Any]) -> str | None:
    if ref["step"] != res["step"] or ref["epoch"] != res["epoch"]:
        return f"position differs (epoch/step {ref['epoch']}/{ref['step']} vs {res['epoch']}/{res['step']})"
    if ref["batch"] != res["batch"]:
        ids = f" (sample ids {ref.get('sample_ids')} vs {res.get('sample_ids')})" if "sample_ids" in ref else ""
        return f"the batch differs{ids}"
    if ref["loss"] != res["loss"]:
        return f"the loss differs ({float.fromhex(ref['loss'])!r} vs {float.fromhex(res['loss'])!r})"
    for name, digest in ref.get("params", {}).items():
        if res.get("params", {}).get(name) != digest:
            return f"parameter {name!r} differs after the optimizer step"
    return None


def _importable(factory: Callable[[], Any], argument: str) -> str:
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"{argument}={factory!r} must be importable by name (a module-level function or class), because the "
            "runs happen in fresh processes; move it to module level in an importable file."
        )
    return f"{module}:{qualname}"


def assert_exact_resume(
    model_factory: Callable[[], Any],
    datamodule_factory: Callable[[], Any],
    *,
    steps: int,
    interrupt_at: int,
    devices: int = 2,
    checkpoint_every: int | None = None,
    seed: int = 0,
    trainer_kwargs: dict[str, Any] | None = None,
    strategy: Literal["ddp", "data_parallel", "model_parallel"] = "ddp",
    strategy_kwargs: dict[str, Any] | None = None,
    checkpoint: Literal["resumable", "stock"] = "resumable",
    checkpoint_kwargs: dict[str, Any] | None = None,
    trace_params: bool = True,
    workdir: str | Path | None = None,
    timeout_s: float = 300.0,
) -> ResumeReport:
    """Train uninterrupted and interrupted-then-resumed on CPU DDP, and assert both end bitwise identical.

    Both runs are real multi-process jobs (``torchrun``, gloo) with the same seed. The second one is killed with
    SIGKILL right after its checkpoint at step ``interrupt_at`` is durable, then re-run with the same command, which
    resumes automatically. The assertion fails with the first diverging step, rank and tensor name.

    Args:
        model_factory: Module-level callable returning the ``LightningModule``.
        datamodule_factory: Module-level callable returning the ``LightningDataModule``.
        steps: Optimizer steps to train (``Trainer(max_steps=...)``).
        interrupt_at: Step whose checkpoint the interrupted run is killed after; ``0 < interrupt_at < steps``.
        devices: Processes (CPU, gloo).
        checkpoint_every: Checkpoint every this many steps (default: ``interrupt_at``).
        seed: Seed passed to ``seed_everything`` in both runs.
        trainer_kwargs: Extra JSON-serialisable ``Trainer`` arguments (e.g. ``{"limit_val_batches": 0}``).
        strategy: ``ddp`` (Lightning's), ``data_parallel`` or ``model_parallel`` (lightning-scale's) when
            ``devices > 1``.
        strategy_kwargs: JSON-serialisable arguments of that strategy (e.g. ``{"zero_stage": 1}``).
        checkpoint: ``"resumable"`` uses :class:`~lightning_scale.callbacks.ResumableCheckpoint` with auto-resume;
            ``"stock"`` uses Lightning's ``ModelCheckpoint`` and ``ckpt_path="last"`` (to show the difference).
        checkpoint_kwargs: Extra JSON-serialisable ``ResumableCheckpoint`` arguments (e.g. ``{"async_save": True}``).
        trace_params: Record a digest of every parameter at every step, to name the first diverging tensor.
        workdir: Directory for checkpoints, traces and logs (default: a new temporary directory).
        timeout_s: Limit for each attempt; a hang fails instead of blocking.

    Returns:
        The :class:`ResumeReport` of both runs, for further assertions.

    Raises:
        AssertionError: The resumed run differs from the uninterrupted one.

    Example:
        >>> from examples.char_transformer import CharDataModule, CharTransformer
        >>> assert_exact_resume(CharTransformer, CharDataModule, steps=30, interrupt_at=12)  # doctest: +SKIP
    """
    report = run_interrupted_and_reference(
        model_factory,
        datamodule_factory,
        steps=steps,
        interrupt_at=interrupt_at,
        devices=devices,
        checkpoint_every=checkpoint_every,
        seed=seed,
        trainer_kwargs=trainer_kwargs,
        strategy=strategy,
        strategy_kwargs=strategy_kwargs,
        checkpoint=checkpoint,
        checkpoint_kwargs=checkpoint_kwargs,
        trace_params=trace_params,
        workdir=workdir,
        timeout_s=timeout_s,
    )
    problem = report.first_divergence()
    if problem:
        raise AssertionError(f"The resumed run diverged from the uninterrupted one at {problem} ({report.workdir}).")
    return report


def run_interrupted_and_reference(
    model_factory: Callable[[], Any],
    datamodule_factory: Callable[[], Any],
    *,
    steps: int,
    interrupt_at: int,
    devices: int = 2,
    checkpoint_every: int | None = None,
    seed: int = 0,
    trainer_kwargs: dict[str, Any] | None = None,
    strategy: Literal["ddp", "data_parallel", "model_parallel"] = "ddp",
    strategy_kwargs: dict[str, Any] | None = None,
    checkpoint: Literal["resumable", "stock"] = "resumable",
    checkpoint_kwargs: dict[str, Any] | None = None,
    trace_params: bool = True,
    workdir: str | Path | None = None,
    timeout_s: float = 300.0,
) -> ResumeReport:
    """Run both jobs of :func:`assert_exact_resume` and return their report without asserting."""
    every = checkpoint_every or interrupt_at
    if not 0 < interrupt_at < steps:
        raise ValueError(f"interrupt_at={interrupt_at} must be between 0 and steps={steps} (exclusive).")
    if interrupt_at % every:
        raise ValueError(
            f"interrupt_at={interrupt_at} is not a multiple of checkpoint_every={every}: no checkpoint is written at "
            "that step. Choose interrupt_at as a multiple of checkpoint_every."
        )
    clashes = sorted(set(trainer_kwargs or {}) & _RUNNER_TRAINER_ARGS)
    if clashes:
        raise ValueError(f"trainer_kwargs may not set {clashes}: assert_exact_resume sets them itself.")
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="exact-resume-"))
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"workdir={str(root)!r} is not empty; old checkpoints there would be resumed. Use a new one.")
    base = {
        "model_factory": _importable(model_factory, "model_factory"),
        "datamodule_factory": _importable(datamodule_factory, "datamodule_factory"),
        "steps": steps,
        "devices": devices,
        "seed": seed,
        "checkpoint": checkpoint,
        "checkpoint_kwargs": checkpoint_kwargs or {},
        "checkpoint_every": every,
        "trainer_kwargs": trainer_kwargs or {},
        "strategy": strategy,
        "strategy_kwargs": strategy_kwargs or {},
        "trace_params": trace_params,
        "sys_path": [p for p in sys.path if p],
    }
    reference = _job(root / "reference", {**base, "interrupt_at": None})
    _attempt(reference, timeout_s, expect="finish")
    interrupted = _job(root / "interrupted", {**base, "interrupt_at": interrupt_at})
    _attempt(interrupted, timeout_s, expect="marker")
    _attempt(interrupted, timeout_s, expect="finish")  # the same command again: it must resume by itself
    return ResumeReport(
        reference=_traces(reference.parent, devices),
        resumed=_traces(interrupted.parent, devices),
        reference_weights=torch.load(reference.parent / "final_rank0.pt", weights_only=True),
        resumed_weights=torch.load(interrupted.parent / "final_rank0.pt", weights_only=True),
        workdir=root,
    )


def _job(out_dir: Path, config: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        **config,
        "out_dir": str(out_dir),
        "ckpt_dir": str(out_dir / "checkpoints"),
        "marker": str(out_dir / "interrupted.marker"),
    }
    path = out_dir / "config.json"
    path.write_text(json.dumps(config, indent=1))
    return path


def _command(config_path: Path, devices: int, max_restarts: int = 0) -> list[str]:
    runner = ["-m", "lightning_scale.testing._runner", str(config_path)]
    if devices == 1:
        return [sys.executable, *runner]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}"]
    return [sys.executable, *launcher, f"--max-restarts={max_restarts}", *runner]


def _attempt(config_path: Path, timeout_s: float, expect: Literal["finish", "marker", "failure"]) -> int:
    """Run the job once; ``marker``: SIGKILL it when the runner says so; ``failure``: it must exit non-zero."""
    config = json.loads(config_path.read_text())
    out_dir = Path(config["out_dir"])
    marker = Path(config["marker"])
    marker.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(config["sys_path"])}
    env.update(config.get("launch_env", {}))
    command = _command(config_path, config["devices"], config.get("max_restarts", 0))
    with open(out_dir / "log.txt", "a") as log:
        log.write(f"\n===== attempt: {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        try:
            while process.poll() is None:
                if expect == "marker" and marker.exists():
                    kill_process_tree(process.pid)
                    return process.wait()
                if time.monotonic() > deadline:
                    raise AssertionError(f"attempt timed out after {timeout_s:.0f} s{_tail(out_dir)}")
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                kill_process_tree(process.pid)
                process.wait()
    if expect == "failure":
        if process.returncode == 0:
            raise AssertionError(f"the job exited 0 although it should have stopped early{_tail(out_dir)}")
        return process.returncode
    if process.returncode != 0:
        raise AssertionError(f"attempt exited with code {process.returncode}{_tail(out_dir)}")
    if expect == "marker":
        raise AssertionError(f"the run finished without reaching its interruption point{_tail(out_dir)}")
    return 0


def _tail(out_dir: Path, lines: int = 40) -> str:
    text = (out_dir / "log.txt").read_text(errors="replace").splitlines()
    dumps = [i for i, line in enumerate(text) if line.startswith("STACK DUMP:")]  # see _runner._StackDumpIfStuck
    stacks = "\n".join(text[dumps[0] : dumps[0] + 300]) + "\n...\n" if dumps else ""
    return "; log tail:\n" + stacks + "\n".join(text[-lines:])


def _traces(out_dir: Path, devices: int) -> dict[int, list[dict[str, Any]]]:
    traces = {}
    for rank in range(devices):
        path = out_dir / f"trace_rank{rank}.jsonl"
        traces[rank] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return traces
