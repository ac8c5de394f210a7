"""What a node holds of a job's snapshots, and their removal."""

from __future__ import annotations

import torch

from lightning_scale.snapshot.codec import pack
from lightning_scale.snapshot.node import NodeSnapshots, free_bytes, job_directory
from lightning_scale.snapshot.slots import SnapshotHeader


def test_a_node_lists_every_rank_it_holds_and_clearing_leaves_nothing(tmp_path):
    directory = job_directory("s3://bucket/run", root=str(tmp_path))
    assert directory == job_directory("s3://bucket/run/", root=str(tmp_path))
    assert directory != job_directory("s3://bucket/other", root=str(tmp_path))
    node = NodeSnapshots(directory)
    assert node.inventory() == [] and node.ranks() == []
    for rank in (0, 3):
        header = SnapshotHeader(rank, 4, 5, 0, 0, "run", 0, 0.0, {})
        node.slots(rank).write(header, pack({"w": torch.ones(3)}))
    assert node.ranks() == [0, 3]
    assert sorted((h.rank, h.step) for h in node.inventory()) == [(0, 5), (3, 5)]
    assert node.find(3, (0, 5), "run") is not None and node.find(3, (0, 5), "other") is None
    assert free_bytes(directory / "not" / "there") > 0
    node.clear()
    assert not directory.parent.exists()  # the user's folder too, once empty
    assert list(tmp_path.iterdir()) == []
