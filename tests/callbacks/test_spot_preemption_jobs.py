"""Acceptance: SIGTERM to one rank of a 2-process DDP job (torchrun, gloo) stops every rank at the same step,
checkpoints, exits 143 with no process left, and the same command resumes at that step, ending bitwise identical."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.testing import (
    CloudNotices,
    Fault,
    JobConfig,
    assert_same_tensors,
    kill_process_tree,
    launch_command,
    launch_environment,
    processes_of_job,
    read_traces,
    run_attempt,
    write_job,
)
from lightning_scale.testing.launch import RUNNER

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

BATCHES_PER_EPOCH = 22
ROOT = Path(__file__).resolve().parents[2]


def base_config(steps: int, **changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.factories:model",
        datamodule_factory="tests.factories:data_workers2",
        steps=steps,
        checkpoint_every=10,
        trainer_kwargs={"limit_val_batches": 0},
        trace_params=False,
        spot_preemption=CloudNotices(),
    )
    return dataclasses.replace(config, **changes)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """``run(config)``: the output directory of an uninterrupted run of ``config``, run once per module."""
    runs: dict[str, Path] = {}

    def run(config: JobConfig) -> Path:
        key = config.to_json()
        if key not in runs:
            out = tmp_path_factory.mktemp("reference")
            run_attempt(write_job(out, config), 300, expect="finish")
            runs[key] = out
        return runs[key]

    return run


def assert_same_final_weights(job: Path, reference: Path) -> None:
    resumed = torch.load(job / "final_rank0.pt", weights_only=True)
    expected = torch.load(reference / "final_rank0.pt", weights_only=True)
    assert_same_tensors(resumed, expected, "rank 0's final weights")


@pytest.mark.parametrize(
    ("rank", "step", "async_save"),
    [(0, BATCHES_PER_EPOCH + 5, True)],
    ids=["rank0-second-epoch-async-saves"],  # rank 1 alone, epoch 0 and the user's data: the user-code matrix
)
def test_sigterm_to_one_rank_stops_all_saves_exits_143_and_resumes_exactly(
    tmp_path, reference_run, snapshot_root, rank, step, async_save
):
    steps = BATCHES_PER_EPOCH + 12
    reference = reference_run(base_config(steps))
    config = base_config(
        steps,
        checkpoint_every=2 if async_save else 10,
        checkpoint_kwargs={"async_save": async_save},
        faults=(Fault(step=step, rank=rank, kind="SIGTERM"),),
    )
    job = write_job(tmp_path / "job", config)
    run_attempt(job, 300, expect="failure")
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "exitcode  : 143" in log and "Preempted at step" in log
    assert "Auto-resuming" not in log  # the first attempt started fresh; the checks below see where the re-run starts
    assert processes_of_job(tmp_path / "job") == []  # ranks and dataloader workers are all gone
    assert list(snapshot_root.iterdir()) == []  # the snapshots, no newer than the checkpoint, were freed
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    # the notice is seen at the vote after step + 1, answered on every rank at the next one (votes do not wait)
    assert manifest is not None and manifest.global_step == step + 2

    run_attempt(job, 300, expect="finish")  # the same command again
    log = (tmp_path / "job" / "log.txt").read_text()
    assert f"Resumed after a preemption: SIGTERM notice, checkpointed at step {step + 2}" in log
    traces = read_traces(tmp_path / "job", 2)
    reference_traces = read_traces(reference, 2)
    for r in (0, 1):
        assert [rec["step"] for rec in traces[r]] == list(range(1, steps + 1))  # restarted at step + 3, none lost
        assert [rec["batch"] for rec in traces[r]] == [rec["batch"] for rec in reference_traces[r]]
    assert_same_final_weights(tmp_path / "job", reference)


class Metadata(http.server.BaseHTTPRequestHandler):
    """The three providers' metadata endpoints, as far as preemption notices go; the provider named by ``noticed``
    announces a preemption, the others none."""

    noticed: str | None = None

    def do_PUT(self) -> None:  # AWS IMDSv2 token
        self._answer(200, b"token-1" if self.path == "/latest/api/token" else b"")

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                return self._answer(401, b"")
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
            return self._answer(200, json.dumps({"action": "terminate", "time": when}).encode()) \
                if self.noticed == "aws" else self._answer(404, b"")  # fmt: skip
        if self.path == "/computeMetadata/v1/instance/preempted" and self.headers.get("Metadata-Flavor") == "Google":
            return self._answer(200, b"TRUE" if self.noticed == "gcp" else b"FALSE")
        if self.path.startswith("/metadata/scheduledevents") and self.headers.get("Metadata") == "true":
            events = [{"EventId": "E1", "EventType": "Preempt", "NotBefore": ""}] if self.noticed == "azure" else []
            return self._answer(200, json.dumps({"DocumentIncarnation": 1, "Events": events}).encode())
        return self._answer(404, b"")

    def do_POST(self) -> None:  # Azure's acknowledgement
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(200, b"")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_cloud_notice_from_a_loopback_metadata_server_stops_the_job_and_it_resumes_exactly(tmp_path, reference_run):
    """The ranks poll all three providers' metadata servers (on loopback); Azure's announces a preemption (its
    protocol has the most steps: events, then an acknowledgement), the others keep answering "none". Each provider's
    protocol, answers and failures are tested in tests/preemption/test_sources.py."""
    steps, provider = 150, "azure"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Metadata.noticed = None
    try:
        config = base_config(steps, checkpoint_every=50, datamodule_factory="tests.factories:data_workers0")
        reference = reference_run(config)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        urls = CloudNotices(aws_base_url=url, gcp_base_url=url, azure_base_url=url)
        job = write_job(tmp_path / "job", dataclasses.replace(config, spot_preemption=urls))

        def notice_when_training() -> None:
            trace = tmp_path / "job" / "trace_rank0.jsonl"
            while not (trace.exists() and len(trace.read_text().splitlines()) >= 20):
                time.sleep(0.02)
            Metadata.noticed = provider

        threading.Thread(target=notice_when_training, daemon=True).start()
        run_attempt(job, 300, expect="failure")
        log = (tmp_path / "job" / "log.txt").read_text()
        assert f"Preemption notice from {provider}" in log and "exitcode  : 143" in log
        manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
        stopped_at = len(read_traces(tmp_path / "job", 2)[0])
        assert manifest is not None and manifest.global_step == stopped_at < steps

        Metadata.noticed = None  # the replacement machine has no notice pending
        run_attempt(job, 300, expect="finish")
        traces, reference_traces = read_traces(tmp_path / "job", 2), read_traces(reference, 2)
        assert [r["step"] for r in traces[0]] == list(range(1, steps + 1))
        assert [r["batch"] for r in traces[1]] == [r["batch"] for r in reference_traces[1]]
        assert_same_final_weights(tmp_path / "job", reference)
    finally:
        server.shutdown()


def test_sigkill_of_one_rank_ends_the_job_quickly_without_a_hang(tmp_path):
    faults = (Fault(step=8, rank=1, kind="SIGKILL"),)
    config = base_config(40, datamodule_factory="tests.factories:data_workers0", faults=faults)
    job = write_job(tmp_path / "job", config)
    started = time.monotonic()
    run_attempt(job, 120, expect="failure")
    assert time.monotonic() - started < 60  # gloo sees the dead peer at once; torchrun ends the job
    assert processes_of_job(tmp_path / "job") == []
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is None or manifest.global_step <= 8  # nothing half-written was published


def test_two_torchrun_agents_restart_a_preempted_multi_node_job_exactly(tmp_path, reference_run):
    """Two "nodes" (torchrun agents, 1 process each, c10d rendezvous on 127.0.0.1): SIGTERM to rank 1, both agents
    restart their worker, the job resumes at the agreed step and ends bitwise equal to an uninterrupted run."""
    steps = BATCHES_PER_EPOCH + 12
    reference = reference_run(base_config(steps))
    faults = (Fault(step=10, rank=1, kind="SIGTERM"),)
    config = base_config(steps, devices=1, num_nodes=2, distributed=True, faults=faults)
    job = write_job(tmp_path / "job", config)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = launch_environment([ROOT], TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    command = launch_command(
        ["-m", RUNNER, str(job)], 1, max_restarts=2, nodes=2, rendezvous_endpoint=f"127.0.0.1:{port}"
    )
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(tmp_path / f"agent{i}.log", "w")) for i in range(2)]
        agents = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env) for log in logs]
        try:
            codes = [agent.wait(timeout=300) for agent in agents]
        finally:
            for agent in agents:
                if agent.poll() is None:
                    kill_process_tree(agent.pid)
    output = "".join((tmp_path / f"agent{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], output[-3000:]
    assert "Preempted at step 12" in output and "Auto-resuming from" in output  # fault at 10, vote read a step later
    for rank in (0, 1):
        last_record = {r["step"]: r for r in read_traces(tmp_path / "job", 2)[rank]}
        reference_records = read_traces(reference, 2)[rank]
        assert [last_record[r["step"]]["batch"] for r in reference_records] == [r["batch"] for r in reference_records]
    assert_same_final_weights(tmp_path / "job", reference)


def test_a_notice_during_validation_stops_there_and_the_job_resumes_exactly(tmp_path):
    steps = 30
    config = base_config(
        steps,
        datamodule_factory="tests.factories:data_workers0",
        checkpoint_every=7,  # so that the checkpoint written during validation at step 10 is a new one
        trainer_kwargs={"val_check_interval": 10, "limit_val_batches": 4},
    )
    reference = write_job(tmp_path / "reference", config)
    run_attempt(reference, 300, expect="finish")
    faults = (Fault(step=10, rank=1, kind="SIGTERM", val_batch=1),)
    job = write_job(tmp_path / "job", dataclasses.replace(config, faults=faults))
    run_attempt(job, 300, expect="failure")
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "exitcode  : 143" in log
    assert [r["step"] for r in read_traces(tmp_path / "job", 2)[0]] == list(range(1, 11))  # no training step after it
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is not None and manifest.global_step == 10
    run_attempt(job, 300, expect="finish")
    assert_same_final_weights(tmp_path / "job", tmp_path / "reference")


def test_data_parallel_strategy_restarts_without_torch_disable_share_rdzv_tcp_store(tmp_path):
    """The same mixed faults, launched as users type it (no environment variable), with strategy data_parallel."""
    steps = 60
    config = base_config(steps, datamodule_factory="tests.factories:data_workers0")
    reference = write_job(tmp_path / "reference", config)
    run_attempt(reference, 300, expect="finish")
    faults = (  # one per attempt: torchrun restarts the job after each
        Fault(step=12, rank=1, kind="SIGTERM"),
        Fault(step=25, rank=0, kind="SIGKILL"),
        Fault(step=44, rank=0, kind="SIGTERM"),
    )
    launch_env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    job_config = dataclasses.replace(
        config, faults=faults, max_restarts=3, launch_env=launch_env, strategy="data_parallel"
    )
    job = write_job(tmp_path / "job", job_config)
    run_attempt(job, 400, expect="finish")
    assert (tmp_path / "job" / "log.txt").read_text().count("Auto-resuming from") == 3
    assert_same_final_weights(tmp_path / "job", tmp_path / "reference")
