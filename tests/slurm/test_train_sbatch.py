"""The shipped ``examples/slurm/train.sbatch`` on a real single-node Slurm cluster (``tests/slurm/cluster.py``):
preempted by ``scancel --signal=USR1 --batch`` and by its ``--signal`` timer, its node lost, requeued, resumed.

Each job runs the script as shipped, changed only where a test must: one node with 2 tasks of 1 CPU (the cluster
has one node of 2 CPUs), the time limit and signal lead of the timer test, the checkpoint folder, and arguments
passed through to ``lightning-scale fit``: the seed, the step count, the log folder, the requeue cap and a user's
module and data (in place of the example's) in one test, and a pace for the first run of a job (a sleep after each
step, which changes nothing the job computes: ``tests/slurm/pace.py``).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore, consolidate_checkpoint, find_newest_valid
from tests.slurm.cluster import ROOT, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
STEPS = 200  # the config checkpoints every 50 steps
# A first run paced this much still has seconds of training left when a test acts after the checkpoint of step 50 or
# 100 (the notice takes up to a second to be seen), on a busy machine too; requeued runs go at full speed.
PACE = ("--trainer.callbacks+=tests.slurm.pace.Pace", "--trainer.callbacks.seconds_per_step")
# A user's code in place of the example's: a plain module, torch's DataLoader with shuffle=True and 2 workers,
# randomness (torch, NumPy, random) in __getitem__
USER_CODE = ("--model=tests.data.user_code.UserMLP", "--data=tests.data.user_code.UserData",
             '--data.cell={"loader": "torch", "shuffle": "shuffle_true", "workers": 2}')  # fmt: skip
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 240.0


def submit(cluster: SlurmCluster, tmp_path: Path, *options: str, steps: int = STEPS, fit: tuple[str, ...] = ()) -> str:
    """Submit the shipped script as a 2-task job on the one node, checkpoints in ``tmp_path/ckpts``, its output in
    ``tmp_path/slurm-<id>.out``; the job id."""
    env = cluster.job_env(CKPT_DIR=str(tmp_path / "ckpts"))
    resources = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--output={tmp_path}/slurm-%j.out"]
    args = ["--seed_everything", "0", "--trainer.max_steps", str(steps), "--trainer.enable_progress_bar", "false"]
    args += ["--trainer.default_root_dir", str(tmp_path / "logs"), *fit]
    return cluster.submit(SBATCH, *resources, *options, args=args, env=env)


def job_output(tmp_path: Path, job: str) -> str:
    path = tmp_path / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def newest_step(ckpt_dir: Path) -> int:
    """The step of the newest valid checkpoint (its manifest is published last: it is whole); -1 when none."""
    manifest, _ = find_newest_valid(CheckpointStore(str(ckpt_dir)))
    return -1 if manifest is None else manifest.global_step


def wait_for_checkpoint(cluster: SlurmCluster, tmp_path: Path, job: str, step: int) -> None:
    """Until a valid checkpoint of ``step`` or later is in place."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while newest_step(tmp_path / "ckpts") < step:
        fields = cluster.job(job)
        assert time.monotonic() < deadline and fields["JobState"] in {"PENDING", "RUNNING"}, (
            f"no checkpoint of step {step}: {fields}\n{job_output(tmp_path, job)[-3000:]}"
        )
        time.sleep(0.1)


def final_state(ckpt_dir: Path) -> dict[str, Any]:
    """The newest valid checkpoint's step, weights and optimizer state (ZeRO-1's per-rank shares merged)."""
    manifest, _ = find_newest_valid(CheckpointStore(str(ckpt_dir)))
    assert manifest is not None, f"no valid checkpoint in {ckpt_dir}"
    checkpoint = consolidate_checkpoint(ckpt_dir / manifest.name, ckpt_dir.parent / "consolidated.ckpt")
    return {"step": checkpoint["global_step"], "weights": checkpoint["state_dict"],
            "optimizer": checkpoint["optimizer_states"]}  # fmt: skip


def assert_bitwise_equal(resumed: dict[str, Any], reference: dict[str, Any]) -> None:
    assert resumed["step"] == reference["step"] == STEPS
    assert resumed["weights"].keys() == reference["weights"].keys()
    weights = reference["weights"].items()
    different = [name for name, value in weights if not torch.equal(resumed["weights"][name], value)]
    assert not different, f"weights differ from the uninterrupted run's: {different}"
    assert_same(resumed["optimizer"], reference["optimizer"], "optimizer state")


def assert_same(left: Any, right: Any, where: str) -> None:
    """Nested containers of tensors and plain values, equal bit for bit."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left, right), f"{where} differs"
    elif isinstance(left, dict):
        assert left.keys() == right.keys(), f"{where}: keys {sorted(left)} != {sorted(right)}"
        for key in left:
            assert_same(left[key], right[key], f"{where}[{key!r}]")
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), f"{where}: length {len(left)} != {len(right)}"
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert left == right, f"{where}: {left!r} != {right!r}"


@pytest.fixture(scope="module")
def uninterrupted(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """The final state of the same job never interrupted, by the model and data arguments it was given (each run
    once)."""
    states: dict[tuple[str, ...], dict[str, Any]] = {}

    def state(fit: tuple[str, ...] = ()) -> dict[str, Any]:
        if fit not in states:
            tmp_path = tmp_path_factory.mktemp("uninterrupted")
            job = submit(slurm_cluster, tmp_path, fit=fit)
            fields = slurm_cluster.wait_for(job, {"COMPLETED"}, RUN_TIMEOUT_S)
            assert fields["Restarts"] == "0", job_output(tmp_path, job)[-3000:]
            states[fit] = final_state(tmp_path / "ckpts")
        return states[fit]

    return state


@pytest.mark.timeout(600)
def test_usr1_to_the_batch_shell_checkpoints_requeues_and_the_job_ends_bitwise_equal(
    slurm_cluster, uninterrupted, tmp_path
):
    job = submit(slurm_cluster, tmp_path, fit=(*PACE, "0.03"))
    wait_for_checkpoint(slurm_cluster, tmp_path, job, 50)
    slurm_cluster.signal_batch(job)  # what `--signal=B:USR1@90` does at the time limit, and a preempting operator
    slurm_cluster.wait_for(job, {"PENDING", "CONFIGURING", "RUNNING"}, RUN_TIMEOUT_S, restarts=1)
    step = assert_stopped_and_requeued(job_output(tmp_path, job), job)
    slurm_cluster.wait_for(job, {"COMPLETED"}, RUN_TIMEOUT_S, restarts=1)
    assert_resumed(job_output(tmp_path, job), job, step)
    assert_bitwise_equal(final_state(tmp_path / "ckpts"), uninterrupted())


def assert_stopped_and_requeued(output: str, job: str) -> str:
    """Run 0 was stopped by the notice at one step on every rank, checkpointed, and requeued itself; that step."""
    assert f"run 0 of job {job} starts" in output and "USR1 at" in output, output[-3000:]
    assert "SLURM auto-requeueing enabled" not in output  # Lightning's own is off
    stopped = re.findall(r"Preempted at step (\d+) \(file\): checkpoint (\S+) durable [\d.]+ s after", output)
    assert len(stopped) == 1, output[-3000:]
    step, path = stopped[0]
    assert_every_rank_saved(Path(path), int(step))
    assert f"Requeueing SLURM job {job} (requeue 1 of at most 20)" in output
    return step


def assert_resumed(output: str, job: str, step: str) -> None:
    """Run 1 resumed from the checkpoint of ``step``, said so, and billed the gap between the runs."""
    assert f"run 1 of job {job} starts" in output, output[-3000:]
    assert re.search(rf"Auto-resuming from \S+step={step}\.ckpt \(global step {step},", output), output[-3000:]
    assert f"Resumed after a preemption: file notice, checkpointed at step {step}" in output
    gap = re.search(r"including a restart gap of ([\d.]+) s billed as preemption waste", output)
    assert gap and float(gap.group(1)) > 1.0, output[-3000:]


def assert_every_rank_saved(checkpoint: Path, step: int) -> None:
    """The checkpoint is complete (its manifest, published last, names ``step`` and 2 ranks) and holds each rank's own
    state (data position, RNG): the collective save that every rank joined at that step."""
    manifest = json.loads(checkpoint.with_name(checkpoint.name + ".manifest.json").read_text())
    assert (manifest["global_step"], manifest["world_size"]) == (step, 2), manifest
    assert (checkpoint / "rank_0.pt").is_file() and (checkpoint / "rank_1.pt").is_file()


@pytest.mark.timeout(600)
def test_the_time_limit_signal_checkpoints_requeues_and_the_job_ends_bitwise_equal(
    slurm_cluster, uninterrupted, tmp_path
):
    """slurmctld looks at time limits every 30 s: the USR1 of a one-minute job with a 55 s lead comes 5 to 35 s after it
    starts, maybe before training does. Paced to 0.18 s a step, the first run is still training then; once it has
    requeued itself, the time limit of the job is raised (as an operator would), and the second run, at full speed,
    finishes."""
    job = submit(slurm_cluster, tmp_path, "--time=1", "--signal=B:USR1@55", fit=(*PACE, "0.18"))
    slurm_cluster.wait_for(job, {"PENDING", "CONFIGURING", "RUNNING"}, RUN_TIMEOUT_S, restarts=1)
    slurm_cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    step = assert_stopped_and_requeued(job_output(tmp_path, job), job)
    fields = slurm_cluster.wait_for(job, {"COMPLETED"}, RUN_TIMEOUT_S, restarts=1)
    assert fields["TimeLimit"] == "00:10:00", fields
    assert_resumed(job_output(tmp_path, job), job, step)
    assert_bitwise_equal(final_state(tmp_path / "ckpts"), uninterrupted())


@pytest.mark.timeout(600)
def test_a_lost_node_requeued_from_outside_resumes_from_the_newest_checkpoint_and_the_requeue_cap_holds(
    slurm_cluster, uninterrupted, tmp_path, snapshot_root
):
    """Every process of the job is killed (a node lost: no notice, its memory snapshots with it) and an operator
    requeues it; the second run, on what is another node for it, resumes from the newest valid durable checkpoint.
    With ``max_slurm_requeues=1`` that requeue was the last: preempted again, the
    job says so and ends; resubmitted, it finishes, bitwise equal to the job never interrupted. The job trains a user's
    module on torch's ``DataLoader`` with ``shuffle=True`` and 2 workers, with randomness in ``__getitem__``."""
    cap = ("--preemption.max_slurm_requeues", "1")
    job = submit(slurm_cluster, tmp_path, fit=(*USER_CODE, *cap, *PACE, "0.03"))
    wait_for_checkpoint(slurm_cluster, tmp_path, job, 100)
    assert slurm_cluster.kill(job), "no process of the job to kill"
    fields = slurm_cluster.wait_for(job, {"FAILED"}, 60)
    assert fields["ExitCode"] == "0:9", fields  # the batch shell died of SIGKILL
    for memory in snapshot_root.iterdir():  # the node's memory went with it: the requeue runs on another node
        shutil.rmtree(memory)
    newest = newest_step(tmp_path / "ckpts")
    slurm_cluster.requeue(job)
    slurm_cluster.wait_for(job, {"RUNNING"}, RUN_TIMEOUT_S, restarts=1)
    deadline = time.monotonic() + 60
    while f"run 1 of job {job} starts" not in job_output(tmp_path, job):  # its trap is set: preempt it
        assert time.monotonic() < deadline, job_output(tmp_path, job)[-3000:]
        time.sleep(0.1)
    slurm_cluster.signal_batch(job)  # before training starts
    fields = slurm_cluster.wait_for(job, {"FAILED"}, RUN_TIMEOUT_S, restarts=1)
    output = job_output(tmp_path, job)
    assert fields["ExitCode"] == "143:0", f"{fields}\n{output[-3000:]}"
    second = output[output.index(f"run 1 of job {job} starts") :]
    resumed = re.search(rf"Auto-resuming from \S+step={newest}\.ckpt \(global step {newest},", second)
    assert resumed and second.index("USR1 at") < resumed.start(), output[-3000:]  # the notice came first: it counts
    [(step, path)] = re.findall(r"Preempted at step (\d+) \(file\): checkpoint (\S+) durable", output)
    assert_every_rank_saved(Path(path), int(step))
    assert f"Not requeueing SLURM job {job}: it was requeued 1 times already (max_slurm_requeues=1)" in output
    assert "Requeueing SLURM job" not in output

    again = submit(slurm_cluster, tmp_path, fit=(*USER_CODE, *cap))  # what the message says to do
    slurm_cluster.wait_for(again, {"COMPLETED"}, RUN_TIMEOUT_S, restarts=0)
    output = job_output(tmp_path, again)
    assert re.search(rf"Auto-resuming from \S+step={step}\.ckpt \(global step {step},", output), output[-3000:]
    assert f"Resumed after a preemption: file notice, checkpointed at step {step}" in output
    assert_bitwise_equal(final_state(tmp_path / "ckpts"), uninterrupted(USER_CODE))
