"""``assert_exact_resume``: check that YOUR LightningModule and DataModule resume bitwise exactly."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from lightning_scale.testing.job import JobConfig, write_job
from lightning_scale.testing.launch import run_attempt

__all__ = ["ResumeReport", "assert_exact_resume", "assert_same_tensors", "read_traces", "run_interrupted_and_reference"]


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

    @classmethod
    def of_jobs(cls, reference: str | Path, resumed: str | Path, devices: int) -> ResumeReport:
        """The report of two finished runner jobs: their directories (:func:`~lightning_scale.testing.write_job`)."""
        return cls(
            reference=read_traces(reference, devices),
            resumed=read_traces(resumed, devices),
            reference_weights=torch.load(Path(reference) / "final_rank0.pt", weights_only=True),
            resumed_weights=torch.load(Path(resumed) / "final_rank0.pt", weights_only=True),
            workdir=Path(resumed).parent,
        )

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

    Examples:
        >>> from examples.char_transformer import CharDataModule, CharTransformer
        >>> assert_exact_resume(CharTransformer, CharDataModule, steps=30, interrupt_at=12)  # doctest: +SKIP
    """
    config = JobConfig(
        model_factory=_importable(model_factory, "model_factory"),
        datamodule_factory=_importable(datamodule_factory, "datamodule_factory"),
        steps=steps,
        checkpoint_every=checkpoint_every or interrupt_at,
        devices=devices,
        seed=seed,
        strategy=strategy,
        strategy_kwargs=strategy_kwargs or {},
        checkpoint=checkpoint,
        checkpoint_kwargs=checkpoint_kwargs or {},
        trainer_kwargs=trainer_kwargs or {},
        trace_params=trace_params,
        interrupt_at=interrupt_at,
    )
    report = run_interrupted_and_reference(config, workdir=workdir, timeout_s=timeout_s)
    problem = report.first_divergence()
    if problem:
        raise AssertionError(f"The resumed run diverged from the uninterrupted one at {problem} ({report.workdir}).")
    return report


def run_interrupted_and_reference(
    config: JobConfig, *, workdir: str | Path | None = None, timeout_s: float = 300.0
) -> ResumeReport:
    """Run both jobs of :func:`assert_exact_resume` for ``config`` and return their report without asserting.

    Args:
        config: The interrupted job; its ``interrupt_at`` must be set. The reference is the same job without it.
        workdir: Directory for checkpoints, traces and logs (default: a new temporary directory).
        timeout_s: Limit for each attempt.
    """
    if config.interrupt_at is None:
        raise ValueError("config.interrupt_at is None: set the step whose checkpoint the interrupted run stops after.")
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="exact-resume-"))
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"workdir={str(root)!r} is not empty; old checkpoints there would be resumed. Use a new one.")
    reference = write_job(root / "reference", dataclasses.replace(config, interrupt_at=None))
    run_attempt(reference, timeout_s, expect="finish")
    interrupted = write_job(root / "interrupted", config)
    run_attempt(interrupted, timeout_s, expect="marker")
    run_attempt(interrupted, timeout_s, expect="finish")  # the same command again: it must resume by itself
    return ResumeReport.of_jobs(reference.parent, interrupted.parent, config.devices)


def read_traces(out_dir: str | Path, devices: int) -> dict[int, list[dict[str, Any]]]:
    """Per rank, the runner's record of every training step of the job in ``out_dir`` (empty for a missing rank).

    Each record holds ``step`` (after the batch), ``for_step`` (the optimizer step its gradient goes into),
    ``attempt`` (when its attempt started), ``world`` (processes), ``epoch``, ``batch`` (a digest), ``loss``
    (``float.hex``), and when traced
    ``sample_ids`` and ``params`` (a digest per parameter).
    """
    traces = {}
    for rank in range(devices):
        path = Path(out_dir) / f"trace_rank{rank}.jsonl"
        traces[rank] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return traces


def assert_same_final_weights(out_dir: str | Path, reference_dir: str | Path, devices: int) -> None:
    """Every rank's final weights of the runner job in ``out_dir`` equal, bit for bit, those of the job in
    ``reference_dir`` (the same tensor names, none missing, at least one).

    Raises:
        AssertionError: Naming the rank and the first tensor that differs.
    """
    for rank in range(devices):
        final = torch.load(Path(out_dir) / f"final_rank{rank}.pt", weights_only=True)
        expected = torch.load(Path(reference_dir) / f"final_rank{rank}.pt", weights_only=True)
        assert_same_tensors(final, expected, f"rank {rank}")


def assert_same_tensors(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], where: str = ""
) -> None:
    """``actual`` holds the same tensor names as ``expected`` (at least one), each equal bit for bit.

    Raises:
        AssertionError: Naming ``where``, the names that differ between the two, or the first tensor that differs.
    """
    assert expected, f"{where}: nothing to compare (no tensor expected)"
    assert actual.keys() == expected.keys(), f"{where}: names differ: {sorted(actual)} != {sorted(expected)}"
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), f"{where}: {name} differs from the expected tensor"
