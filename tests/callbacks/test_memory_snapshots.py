"""Memory snapshots under torchrun: a 2-process job of a user's code (torch ``DataLoader``, ``shuffle=True``, a worker,
dropout, randomness in ``__getitem__``, stock ``ddp``) resumes each failure from the snapshots in node-local shared
memory, newer than its durable checkpoints, and ends bitwise equal to an uninterrupted run; a process killed in the
middle of a snapshot leaves the one before it; a lost node's rank resumes from the copy of its snapshot on the other
node; finished training leaves nothing in shared memory."""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from lightning_scale.testing import (
    Fault,
    JobConfig,
    assert_same_final_weights,
    kill_process_tree,
    launch_command,
    launch_environment,
    read_job,
    read_traces,
    run_attempt,
    write_job,
)
from lightning_scale.testing.launch import RUNNER

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _config(**changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.data.user_code:model",
        datamodule_factory="tests.data.user_code:data",
        steps=20,
        checkpoint_every=10,  # the durable checkpoints lag behind: each failure below resumes from memory
        checkpoint_kwargs={"snapshot_every_n_steps": 1},
        trainer_kwargs={"limit_val_batches": 0},
        launch_env={"USER_CELL": '{"loader": "torch", "shuffle": "shuffle_true", "workers": 1}'},
    )
    return dataclasses.replace(config, **changes)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _first_steps(traces: dict[int, list[dict]]) -> list[int]:
    """The first step each attempt of the job trained (rank 0's records)."""
    firsts: dict[float, int] = {}
    for record in traces[0]:
        firsts.setdefault(record["attempt"], record["step"])
    return [firsts[attempt] for attempt in sorted(firsts)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run of the jobs below (its snapshots in a shared memory folder of its own)."""
    memory = Path(tempfile.mkdtemp(prefix="lightning-scale-test-", dir="/dev/shm"))
    job = write_job(
        tmp_path_factory.mktemp("reference"),
        _config(launch_env={**_config().launch_env, "LIGHTNING_SCALE_SNAPSHOT_DIR": str(memory)}),
    )
    try:
        run_attempt(job, 120, expect="finish")
        assert list(memory.iterdir()) == []  # a finished fit removes its snapshots
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    return job


def test_every_failure_resumes_from_memory_with_at_most_the_torn_step_replayed(tmp_path, snapshot_root, reference):
    faults = (
        Fault(step=4, rank=1, kind="SIGKILL"),  # a lost process: the snapshot of step 4 is in memory
        Fault(step=8, rank=0, kind="crash"),  # an exception in training
        Fault(step=13, rank=1, kind="SIGKILL", save=True),  # killed in the middle of its step-13 snapshot
    )
    job = write_job(
        tmp_path / "faults",
        _config(
            faults=faults,
            max_restarts=3,
            launch_env={**_config().launch_env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        ),
    )
    run_attempt(job, 240, expect="finish")
    log = (job.parent / "log.txt").read_text(errors="replace")

    resumed = [
        int(step) for step in re.findall(r"Auto-resuming from the memory snapshot of step (\d+) \(on this node\)", log)
    ]
    assert resumed == [4, 8, 12], log[-4000:]  # rank 1's step-13 snapshot was torn: both ranks take step 12's
    assert _first_steps(read_traces(job.parent, 2)) == [1, 5, 9, 13]  # nothing replayed but the torn step
    assert_same_final_weights(job.parent, reference.parent, 2)
    assert list(snapshot_root.iterdir()) == []


def _node(job, port: int, name: str, snapshots, hosts_rendezvous: bool = False) -> subprocess.Popen:
    """A simulated node of a 2-node job: one torchrun agent of one process, with shared memory of its own."""
    config = read_job(job)
    command = launch_command(
        ["-m", RUNNER, str(job)],
        1,
        max_restarts=config.max_restarts,
        nodes=2,
        rendezvous_endpoint=f"127.0.0.1:{port}",
        rendezvous_conf=f"is_host={int(hosts_rendezvous)}",
    )
    env = launch_environment(config.sys_path, **config.launch_env, LIGHTNING_SCALE_SNAPSHOT_DIR=str(snapshots))
    with open(job.parent / f"node_{name}.txt", "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _wait_for_step(out_dir, step: int, nodes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 120
    while not any(r["step"] >= step for r in read_traces(out_dir, 2)[1]):
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in out_dir.glob("node_*.txt"))
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), logs
        time.sleep(0.05)


def test_a_lost_nodes_ranks_resume_from_the_copies_of_their_snapshots_on_the_other_node(
    tmp_path, snapshot_root, reference
):
    env = {**_config().launch_env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # multi-node restarts need it
    job = write_job(
        tmp_path / "nodes",
        _config(devices=1, distributed=True, num_nodes=2, max_restarts=3, warm_restarts=3, launch_env=env),
    )
    port, memory = _free_port(), {name: snapshot_root / f"node_{name}" for name in "abc"}
    nodes = {"a": _node(job, port, "a", memory["a"], hosts_rendezvous=True), "b": _node(job, port, "b", memory["b"])}
    try:
        _wait_for_step(job.parent, 15, list(nodes.values()))  # the durable checkpoint is step 10's
        kill_process_tree(nodes["b"].pid)  # the machine is gone, and its memory with it
        nodes["b"].wait()
        shutil.rmtree(memory["b"])
        nodes["c"] = _node(job, port, "c", memory["c"])  # a new machine takes its place
        assert nodes["a"].wait(timeout=180) == 0 and nodes["c"].wait(timeout=60) == 0
    finally:
        for node in nodes.values():
            if node.poll() is None:
                kill_process_tree(node.pid)
    log = "\n".join(path.read_text(errors="replace") for path in sorted(job.parent.glob("node_*.txt")))
    resumed = re.findall(r"Auto-resuming from the memory snapshot of step (\d+)", log)
    assert len(resumed) == 1 and int(resumed[0]) >= 14, log[-5000:]  # newer than any durable checkpoint
    assert_same_final_weights(job.parent, reference.parent, 2)
    assert [list(path.iterdir()) for path in (memory["a"], memory["c"])] == [[], []]  # finished: freed


@pytest.mark.parametrize(
    ("arguments", "specific"),
    [({}, False), ({"grad_compression": "bf16"}, False), ({"grad_compression": "powersgd"}, True),
     ({"zero_stage": 1}, True), ({"zero_stage": 2, "grad_compression": "fp16"}, True)],
)  # fmt: skip
def test_plain_or_half_precision_data_parallel_snapshots_are_portable_zero_and_powersgd_are_not(arguments, specific):
    """A portable snapshot (every rank's state the same) resumes on another world size from memory."""
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_scale.callbacks._checkpoint_snapshots import holds_rank_specific_state
    from lightning_scale.strategies import DataParallelStrategy

    assert holds_rank_specific_state(DataParallelStrategy(**arguments)) is specific
    assert holds_rank_specific_state(DDPStrategy()) is False
