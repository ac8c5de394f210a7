"""Acceptance of the cost features under 2-process DDP (torchrun, gloo), with a deterministic step clock: 450 s per
step at 8 USD per hour is exactly 1 USD per step; a restart gap of 900 s is exactly 2 USD of preemption waste."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightning_scale.report.wandb_offline import history_values, read_records
from lightning_scale.testing import CloudNotices, CostModel, Fault, JobConfig, read_traces, run_attempt, write_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

COST = CostModel(price_per_hour=8.0, seconds_per_step=450.0, restart_gap_seconds=900.0)


def config(steps: int, **changes) -> JobConfig:
    base = JobConfig(
        model_factory="tests.factories:model",
        datamodule_factory="tests.factories:data_workers0",
        steps=steps,
        checkpoint_every=4,
        trainer_kwargs={"limit_val_batches": 0},
        trace_params=False,
        cost=COST,
    )
    return dataclasses.replace(base, **changes)


def final_cost(job: Path) -> dict[str, float]:
    return json.loads((job.parent / "cost_rank0.json").read_text())


def test_cost_totals_continue_across_a_sigkill_and_resume(tmp_path):
    job = write_job(tmp_path / "job", config(12, interrupt_at=8))
    run_attempt(job, 300, expect="marker")  # killed with SIGKILL right after the step-8 checkpoint
    run_attempt(job, 300, expect="finish")  # the same command resumes from it
    cost = final_cost(job)
    # 12 steps of 450 s, plus the 900 s between the step-8 checkpoint and the resumed start; 1 node at 8 USD/h
    assert cost["cost/usd_total"] == 8.0 * (12 * 450.0 + 900.0) / 3600.0 == 14.0
    assert cost["cost/preemption_waste_usd"] == 2.0  # the lost interval times the price
    assert cost["cost/hours"] == 1.75
    assert cost["cost/usd_per_step"] == 14.0 / 12
    assert "cost/savings_vs_on_demand_usd" not in cost  # an on-demand price: nothing saved against itself


def wandb_runs(wandb_dir: Path) -> list[Path]:
    return sorted((wandb_dir / "wandb").glob("offline-run-*"))


def test_wandb_continues_one_run_across_a_preemption_restart_with_cost_summary_config_and_table(tmp_path):
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    job_config = config(
        12,
        spot_preemption=CloudNotices(),
        faults=(Fault(step=5, rank=1, kind="SIGTERM"),),
        max_restarts=1,
        wandb_dir=str(wandb_dir),
        monitor="val_loss",
        strategy="data_parallel",  # restart-safe process group under torchrun --max-restarts
        trainer_kwargs={"limit_val_batches": 2, "val_check_interval": 4},
    )
    job = write_job(tmp_path / "job", job_config)
    run_attempt(job, 400, expect="finish")  # torchrun restarts the preempted job once; it resumes and finishes
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "Preempted at step 7" in log and "Continuing W&B run" in log  # fault at 5, the vote read a step later

    runs = wandb_runs(wandb_dir)
    ids = {run.name.rsplit("-", 2)[-2] if run.name.endswith("-1") else run.name.rsplit("-", 1)[-1] for run in runs}
    assert len(runs) == 2 and len(ids) == 1, runs  # one run id, one directory per attempt, nothing from rank 1
    first, resumed = (read_records(next(run.glob("run-*.wandb"))) for run in runs)
    steps = [json.loads(v) for v in history_values(first, "trainer/global_step")]
    steps += [json.loads(v) for v in history_values(resumed, "trainer/global_step")]
    assert steps == sorted(steps) and max(steps) == 12  # one line: the second attempt continues the first
    totals = [json.loads(v) for r in (first, resumed) for v in history_values(r, "cost/usd_total")]
    assert totals == sorted(totals) and totals[-1] == 14.0  # 12 steps + a 900 s restart gap, at 1 USD per 450 s

    summary = {
        item.key or "/".join(item.nested_key): json.loads(item.value_json)
        for record in resumed
        if record.WhichOneof("record_type") == "summary"
        for item in record.summary.update
    }
    assert summary["cost/usd_total"] == 14.0 and summary["cost/preemption_waste_usd"] == 2.0
    assert summary["cost/usd_per_hour"] == 8.0 and "cost/usd_at_best_val_loss" in summary
    config_fields = {
        item.key: json.loads(item.value_json)
        for record in resumed
        if record.WhichOneof("record_type") == "config"
        for item in record.config.update
    }
    assert config_fields["cost/node_usd_per_hour"] == {"value": 8.0} or config_fields["cost/node_usd_per_hour"] == 8.0
    assert config_fields["cost/price_source"] in ("price_per_hour", {"value": "price_per_hour"})

    tables = list(runs[1].glob("files/media/table/cost/table_*.table.json"))
    assert len(tables) == 1, list(runs[1].rglob("*.json"))
    table = json.loads(tables[0].read_text())
    assert table["columns"][:3] == ["step", "usd_total", "hours"] and "val_loss" in table["columns"]
    assert [row[0] for row in table["data"]] == [4, 8, 12]  # every validation, the first attempt's included
    assert [row[1] for row in table["data"]] == [4.0, 10.0, 14.0]  # step 8 and 12 after the 2 USD gap


def test_budget_stops_both_ranks_at_the_same_step_and_logs_the_reason(tmp_path):
    # rank 1's clock runs 1.25 times as fast: it reaches 5 USD after step 4, rank 0 only after step 5
    cost = dataclasses.replace(COST, rank_stretch=0.25)
    job = write_job(tmp_path / "job", config(20, cost=cost, budget={"max_cost_usd": 5.0}))
    run_attempt(job, 300, expect="finish")
    traces = read_traces(tmp_path / "job", 2)
    # both ranks stop at the same step: the one after the vote rank 1's yes was cast in (votes do not wait)
    assert [len(traces[rank]) for rank in (0, 1)] == [5, 5]
    log = (tmp_path / "job" / "log.txt").read_text()
    # by then rank 0 has reached it too: the first rank that has is named
    assert "Budget reached (max_cost_usd) on rank 0: $5.0000 >= $5.0 after step 5. Stopping." in log
    assert final_cost(job)["cost/usd_total"] == 5.0  # rank 0's own bill at the stop
