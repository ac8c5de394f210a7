"""HostStager: a sharded model's state (DTensors) is copied into the host buffers of the previous save, as plain
tensors are: no fresh allocation per save."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from lightning_scale.checkpoint.background import HostStager


def test_dtensor_shards_are_copied_into_the_previous_saves_buffers(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    weight = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    stager = HostStager()
    first = stager.copy({"w": weight, "plain": torch.ones(3)})
    weight.to_local().add_(1)  # training goes on in place
    second = stager.copy({"w": weight, "plain": torch.ones(3)})
    assert second["w"].to_local().data_ptr() == first["w"].to_local().data_ptr()  # the same host buffer
    assert second["plain"].data_ptr() == first["plain"].data_ptr()
    assert torch.equal(second["w"].full_tensor(), torch.arange(8.0).reshape(4, 2) + 1)
    assert second["w"].placements == weight.placements
