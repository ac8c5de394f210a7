"""An elastic job loses a node, goes on with the one left, grows back when a node joins, and shrinks again on a spot
notice: two torchrun agents on 127.0.0.1 (simulated nodes, ``--nnodes 1:2``, c10d rendezvous), the command's default
strategy (``"auto"``: Lightning's DDP on 2 processes, a single-device strategy without a distributed sampler on 1) and
the user code of ``elastic_user_code`` (torch's ``DataLoader``, ``shuffle=True``, a worker).

Every sample of each epoch is seen exactly once across the world sizes, every optimizer step takes the samples the
uninterrupted 2-process run's step took (``DataStateCheckpoint(keep_global_batch=True)``), the losses follow that run's,
and the cost log names each change of the node count."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_scale.testing import (
    CloudNotices,
    CostModel,
    Fault,
    JobConfig,
    kill_process_tree,
    launch_command,
    launch_environment,
    read_job,
    run_attempt,
    write_job,
)
from lightning_scale.testing.launch import RUNNER
from lightning_scale.testing.processes import descendants
from tests.elastic.elastic_user_code import BATCH_SIZE, N_SAMPLES

STEPS = 57  # 12 steps per epoch: the job ends in its 5th epoch; node C, started at step 18, has ~8 s (39 steps on one
# node) to join before the job would end without it, which a loaded machine's slow start needs
SAMPLES_PER_STEP = 2 * BATCH_SIZE  # the first world's: 2 nodes x 1 process
LOSS_TOLERANCE = 1e-5  # relative, per step: the same samples per step, summed in another order
# The epoch divides into global batches: Lightning divides every batch's loss by accumulate_grad_batches, also in an
# epoch's last, shorter accumulation window, so where an epoch ends in a partial global batch its last step weighs
# 1/accumulation less on fewer processes (measured with 100 samples: equal up to that step, within 8 % after it).
TIMEOUT_S = 120.0
FAST_RENDEZVOUS = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"  # the README's settings


def _config(**changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.elastic.elastic_user_code:Regressor",
        datamodule_factory="tests.elastic.elastic_user_code:PointsData",
        steps=STEPS,
        checkpoint_every=3,
        devices=1,
        distributed=False,  # the command's default strategy, "auto"
        trace_params=False,
        data_state={"keep_global_batch": True},
        spot_preemption=CloudNotices(),
        cost=CostModel(price_per_hour=3.0, seconds_per_step=60.0),
        max_restarts=6,
        warm_restarts=3,  # as the lightning-scale command runs under torchrun
        launch_env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},  # multi-node torchrun restarts need it (README)
    )
    return dataclasses.replace(config, **changes)


class Node:
    """A simulated node: one torchrun agent of the elastic job, and the worker it starts."""

    def __init__(self, job: Path, port: int, name: str, hosts_rendezvous: bool = False) -> None:
        config = read_job(job)
        command = launch_command(
            ["-m", RUNNER, str(job)],
            1,
            max_restarts=config.max_restarts,
            nodes="1:2",
            rendezvous_endpoint=f"127.0.0.1:{port}",
            rendezvous_conf=f"is_host={int(hosts_rendezvous)},{FAST_RENDEZVOUS}",
        )
        self.log = job.parent / f"node_{name}.txt"
        with open(self.log, "w") as log:
            env = launch_environment(config.sys_path, **config.launch_env)
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def lose(self) -> None:
        """The machine is gone: the agent and every process below it, at once."""
        kill_process_tree(self.process.pid)
        self.process.wait()

    def reclaim_after_notice(self) -> list[int]:
        """A spot reclaim: the agent is gone, its workers get SIGTERM (the notice) and may save before they exit."""
        workers = [pid for pid in descendants(self.process.pid) if _parent(pid) == self.process.pid]
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
        return workers


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _records(out_dir: Path) -> list[dict]:
    found = []
    for path in sorted(out_dir.glob("trace_rank*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                found.append(json.loads(line))
    return found


def _wait_for(condition: Callable[[], bool], what: str, out_dir: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in out_dir.glob("node_*"))
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)


def _reached(out_dir: Path, world: int, step: int, after: float = 0.0) -> Callable[[], bool]:
    return lambda: any(
        r["world"] == world and r["for_step"] >= step and r["attempt"] > after for r in _records(out_dir)
    )


def _effective(records: list[dict]) -> list[dict]:
    """The records that count: an attempt's steps up to where the next attempt resumed (later steps were lost)."""
    attempts = sorted({r["attempt"] for r in records})
    first = {a: min(r["for_step"] for r in records if r["attempt"] == a) for a in attempts}
    kept = []
    for a, following in zip(attempts, [*attempts[1:], None], strict=True):
        limit = math.inf if following is None else first[following]
        kept += [r for r in records if r["attempt"] == a and r["for_step"] < limit]
    return kept


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The uninterrupted 2-process run (DDP) every job here is compared with: one run for the module."""
    out = tmp_path_factory.mktemp("reference")
    run_attempt(write_job(out, _config(devices=2, launch_env={})), TIMEOUT_S, expect="finish")
    return _records(out)


def _assert_follows(records: list[dict], uninterrupted: list[dict], steps: int) -> None:
    """Every optimizer step up to ``steps`` took the samples of the uninterrupted run's, and its loss."""
    elastic, expected = _per_step(records), _per_step(uninterrupted)
    assert sorted(elastic) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        samples, loss = expected[step]
        assert elastic[step][0] == samples, f"step {step} took other samples"
        assert abs(elastic[step][1] - loss) <= LOSS_TOLERANCE * loss, f"step {step}: {elastic[step][1]} vs {loss}"


def _per_step(records: list[dict]) -> dict[int, tuple[list[int], float]]:
    """Per optimizer step: its samples, and their mean loss (Lightning divides a batch's loss by the accumulation)."""
    samples, weighted = collections.defaultdict(list), collections.defaultdict(float)
    for r in records:
        accumulation = SAMPLES_PER_STEP // (BATCH_SIZE * r["world"])
        samples[r["for_step"]] += r["sample_ids"]
        weighted[r["for_step"]] += float.fromhex(r["loss"]) * accumulation * len(r["sample_ids"])
    return {step: (sorted(ids), weighted[step] / len(ids)) for step, ids in samples.items()}


@pytest.mark.multiprocess
@pytest.mark.timeout(420)
def test_a_job_that_loses_and_regains_nodes_sees_every_sample_once_and_follows_the_uninterrupted_run(
    tmp_path, reference
):
    job = write_job(tmp_path / "elastic", _config())
    out = job.parent
    port = _free_port()
    nodes = {"a": Node(job, port, "a", hosts_rendezvous=True), "b": Node(job, port, "b")}  # a outlives the others
    try:
        _wait_for(_reached(out, world=2, step=8), "step 8 on 2 nodes", out)
        nodes["b"].lose()  # mid-epoch 0, after the checkpoint of step 6

        _wait_for(_reached(out, world=1, step=18), "step 18 on the node left", out)
        shrunk = max(r["attempt"] for r in _records(out))
        nodes["c"] = Node(job, port, "c")  # the agent sees a node waiting and restarts its workers with SIGTERM
        _wait_for(_reached(out, world=2, step=40, after=shrunk), "step 40 on 2 nodes again", out)
        reclaimed = nodes["c"].reclaim_after_notice()  # mid-epoch 3

        assert nodes["a"].process.wait(timeout=TIMEOUT_S) == 0
        _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in reclaimed), "the notified worker", out)
    finally:
        for node in nodes.values():
            if node.process.poll() is None:
                node.lose()

    records = _effective(_records(out))
    worlds = {r["attempt"]: r["world"] for r in records}
    assert [worlds[attempt] for attempt in sorted(worlds)] == [2, 1, 2, 1]
    by_epoch = collections.defaultdict(list)
    for r in records:
        by_epoch[r["epoch"]] += r["sample_ids"]
    for epoch in (0, 1, 2, 3):
        assert sorted(by_epoch[epoch]) == list(range(N_SAMPLES)), f"epoch {epoch}"
    assert len(set(by_epoch[4])) == len(by_epoch[4])  # the epoch the job ends in: nothing twice so far
    _assert_follows(records, reference, STEPS)

    log = "\n".join(path.read_text(errors="replace") for path in sorted(out.glob("node_*.txt")))
    changes = [line.split("CostTracker: ")[1].split(":")[0] for line in log.splitlines() if "CostTracker: the" in line]
    assert sorted(changes) == [  # rank 0 of an attempt may be on either node: the logs are not in time order
        "the job runs on 1 node(s) now, 2 before",
        "the job runs on 1 node(s) now, 2 before",
        "the job runs on 2 node(s) now, 1 before",
    ], changes
    assert log.count("accumulate_grad_batches 1 -> 2") == 2  # on 1 node; on 2 the Trainer's own 1 keeps it
    assert log.count("draws through the DistributedSampler Lightning's DDP would give it on one process") >= 2
    assert log.count("Resuming epoch 0 on 1 processes") == 1  # B was lost in epoch 0, after the checkpoint of step 6
    assert log.count("Resuming epoch 3 on 1 processes") == 1  # C's notice came in epoch 3 (steps 37-48)
    # C joins 8-10 steps (about 2 s) after step 18: the save it causes falls inside epoch 2 (steps 25-36), or else on
    # an epoch's end, where the next epoch is split for the new world
    assert log.count("Resuming epoch") + log.count("the next epoch is split for") == 3


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_model_parallel_job_grows_mid_epoch_from_one_process_to_two_keeping_its_global_batch(tmp_path):
    """FSDP2 on 1 process (2 batches per optimizer step) killed mid-epoch after a sharded checkpoint; the same command
    on 2 processes reshards the weights, deals them the rest of the epoch and steps after every batch: every sample
    once, each step the samples and the loss of an uninterrupted 2-process run. The elastic job above meets a growth
    wherever torchrun's restart falls; this one is in the middle of an epoch by construction."""
    config = _config(
        steps=18,
        strategy="model_parallel",
        strategy_kwargs={"min_params_to_shard": 1},
        distributed=True,
        devices=1,
        trainer_kwargs={"accumulate_grad_batches": 2},  # 1 process x 4 samples x 2 batches: 8 samples per step
        spot_preemption=None,
        cost=None,
        max_restarts=0,
        launch_env={},
        checkpoint_dirpath=str(tmp_path / "checkpoints"),
    )
    reference = dataclasses.replace(config, devices=2, trainer_kwargs={}, checkpoint_dirpath=None)
    run_attempt(write_job(tmp_path / "reference", reference), TIMEOUT_S, expect="finish")
    run_attempt(write_job(tmp_path / "one", dataclasses.replace(config, interrupt_at=6)), TIMEOUT_S, expect="marker")
    run_attempt(write_job(tmp_path / "two", dataclasses.replace(config, devices=2)), TIMEOUT_S, expect="finish")

    records = _effective(_records(tmp_path / "one") + _records(tmp_path / "two"))
    assert sorted(i for r in records if r["epoch"] == 0 for i in r["sample_ids"]) == list(range(N_SAMPLES))
    elastic, uninterrupted = _per_step(records), _per_step(_records(tmp_path / "reference"))
    assert sorted(elastic) == sorted(uninterrupted) == list(range(1, 19))
    for step, (samples, loss) in uninterrupted.items():
        assert elastic[step][0] == samples, f"step {step} took other samples"
        assert abs(elastic[step][1] - loss) <= LOSS_TOLERANCE * loss, f"step {step}: {elastic[step][1]} vs {loss}"
    log = (tmp_path / "two" / "log.txt").read_text()
    assert "Resuming epoch 0 on 2 processes" in log and "accumulate_grad_batches 2 -> 1" in log


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_one_process_with_the_default_strategy_finishes_an_epoch_of_two_and_hands_its_own_back_mid_epoch(
    tmp_path, reference
):
    """The command's defaults, with every change of the world in the middle of an epoch by construction: 2 processes
    (DDP) killed after the checkpoint of step 6; the same job on 1 process (a single-device strategy, launched without
    torchrun) finishes epoch 0, trains into epoch 1 and crashes after the checkpoint of step 21; 2 processes resume in
    the middle of epoch 1 and finish. Every sample once per epoch, each step the uninterrupted run's samples and loss.
    The node-loss test above meets a growth wherever torchrun's restart falls."""
    shared = {
        "steps": 30,
        "spot_preemption": None,
        "cost": None,
        "max_restarts": 0,
        "launch_env": {},
        "checkpoint_dirpath": str(tmp_path / "checkpoints"),
    }
    run_attempt(write_job(tmp_path / "two", _config(devices=2, interrupt_at=6, **shared)), TIMEOUT_S, expect="marker")
    crashes = (Fault(step=21, rank=0, kind="crash"),)  # after its checkpoint, in epoch 1 (steps 13-24)
    run_attempt(write_job(tmp_path / "one", _config(faults=crashes, **shared)), TIMEOUT_S, expect="failure")
    run_attempt(write_job(tmp_path / "again", _config(devices=2, **shared)), TIMEOUT_S, expect="finish")

    records = _effective([r for job in ("two", "one", "again") for r in _records(tmp_path / job)])
    worlds = {r["attempt"]: r["world"] for r in records}
    assert [worlds[attempt] for attempt in sorted(worlds)] == [2, 1, 2]
    for epoch in (0, 1):
        assert sorted(i for r in records if r["epoch"] == epoch for i in r["sample_ids"]) == list(range(N_SAMPLES))
    _assert_follows(records, reference, 30)
    one, again = (tmp_path / "one" / "log.txt").read_text(), (tmp_path / "again" / "log.txt").read_text()
    assert "Resuming epoch 0 on 1 processes" in one and "accumulate_grad_batches 1 -> 2" in one
    assert "draws through the DistributedSampler Lightning's DDP would give it on one process" in one
    assert "Resuming epoch 1 on 2 processes; the checkpoint was written by 1 after 72 of its 96 samples" in again
