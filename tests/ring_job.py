"""lightning_scale.distributed's reduce-scatter and all-gather against torch's, under torchrun (gloo: the ring of
sends and receives on a background thread; several started before the first is waited on).

python -m tests.ring_job CONFIG.json   (config: out); writes result.json: the largest difference from torch's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_scale import distributed


def main(config_path: str) -> None:
    out = Path(json.loads(Path(config_path).read_text())["out"])
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    inputs = [torch.randn(world * size, generator=generator) for size in (1, 7, 1000)]
    expected = []
    for tensor in inputs:
        mine = torch.empty(tensor.numel() // world)
        dist.reduce_scatter_tensor(mine, tensor.clone())
        gathered = torch.empty(tensor.numel())
        dist.all_gather_into_tensor(gathered, mine)
        expected += [mine, gathered]
    outputs = [torch.empty(t.numel() // world) for t in inputs]
    works = [distributed.reduce_scatter_start(o, t.clone()) for o, t in zip(outputs, inputs, strict=True)]
    for work in works:
        work.wait()
    gathered = [torch.empty(t.numel()) for t in inputs]
    works = [distributed.all_gather_start(g, o) for g, o in zip(gathered, outputs, strict=True)]
    for work in works:
        work.wait()
    got = [t for pair in zip(outputs, gathered, strict=True) for t in pair]
    difference = max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True))
    differences = distributed.all_gather_object(difference)
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"differences": differences, "world": world}))
        torch.save({}, out / "weights.pt")  # tests/jobs.py reads one
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
