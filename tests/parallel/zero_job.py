"""ZeroSharding against torch's DistributedDataParallel, without Lightning, under torchrun.

python -m tests.parallel.zero_job CONFIG.json   (config: out, cases: {name: {stage, optimizer, accumulate,
reduce_dtype, clip}}); writes result.json: per case, the largest difference from DDP's parameters after each step,
the reductions each backward launched, and this rank's optimizer state bytes against DDP's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lightning_scale import distributed
from lightning_scale.parallel.data import ZeroSharding, training_state_bytes

STEPS = 6


class Net(nn.Module):
    """Parameters of awkward sizes (fewer elements than ranks, odd counts), one in float64, one used by rank 0 only, a
    buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(7, 13), nn.Linear(13, 3)
        self.scale = nn.Parameter(torch.ones(1, dtype=torch.float64))
        self.rank0_only = nn.Parameter(torch.full((5,), 0.5))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.b(torch.tanh(self.a(x))) * self.scale.float()
        if dist.get_rank() == 0:
            out = out + self.rank0_only[:3]
        return out


def optimizer_of(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + 10 * micro + dist.get_rank())
    return torch.randn(4, 7, generator=generator), torch.randn(4, 3, generator=generator)


def bucket_bytes(zero: ZeroSharding) -> int:
    """Bytes the buckets' reduction buffers keep alive (a column view keeps its buffer too)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for b in zero.buckets
                for t in ([b.buffer] if b.buffer is not None else []) + b.columns}  # fmt: skip
    return sum(storages.values())


def run_case(case: dict) -> dict:
    torch.manual_seed(0)
    reference, mine = Net(), Net()
    mine.load_state_dict(reference.state_dict())
    ddp = DistributedDataParallel(reference, find_unused_parameters=True)
    ddp_optimizer = optimizer_of(case["optimizer"], reference.parameters())
    dtype = {"fp16": torch.float16, None: None}[case.get("reduce_dtype")]
    zero = ZeroSharding(optimizer_of(case["optimizer"], mine.parameters()), case["stage"], 300, dtype)
    launched = []
    start = distributed.reduce_scatter_start

    def counting(*args, **kwargs):
        launched[-1] += 1
        return start(*args, **kwargs)

    distributed.reduce_scatter_start = counting  # type: ignore[assignment]
    differences, held = [], []
    for step in range(STEPS):
        for micro in range(case.get("accumulate", 1)):
            x, y = batch(step, micro)
            last = micro == case.get("accumulate", 1) - 1
            launched.append(0)
            zero.sync = last
            nn.functional.mse_loss(mine(x), y).backward()
            if last:
                nn.functional.mse_loss(ddp(x), y).backward()
            else:
                with ddp.no_sync():
                    nn.functional.mse_loss(ddp(x), y).backward()
        if case.get("clip"):
            torch.nn.utils.clip_grad_norm_(reference.parameters(), case["clip"])
            zero.clip_grad_norm_(case["clip"])
        ddp_optimizer.step()
        ddp_optimizer.zero_grad()
        zero.optimizer.step()
        zero.optimizer.zero_grad()
        held.append(bucket_bytes(zero))
        differences.append(
            max(float((a - b).abs().max()) for a, b in zip(reference.parameters(), mine.parameters(), strict=True))
        )
    distributed.reduce_scatter_start = start  # type: ignore[assignment]
    zero.close()
    return {
        "differences": differences,
        "launched": launched,
        "bucket_bytes_between_steps": held,
        "buckets": len(zero.buckets),
        "state_bytes": training_state_bytes(mine, [zero.optimizer])["optimizer"],
        "ddp_state_bytes": training_state_bytes(reference, [ddp_optimizer])["optimizer"],
        "untouched_grads": all(p.grad is None for p in mine.parameters()),
    }


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    dist.init_process_group("gloo")
    results = {name: run_case(case) for name, case in config["cases"].items()}
    if dist.get_rank() == 0:
        Path(config["out"], "result.json").write_text(json.dumps(results))
        torch.save({}, Path(config["out"], "weights.pt"))  # tests/jobs.py reads one
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
