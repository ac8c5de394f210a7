"""Who is hung, as the ranks' parents see it: a rank behind the others while they all wait for it."""

from __future__ import annotations

import torch.distributed as dist

from lightning_scale.restart.beacon import Beacon, Progress
from lightning_scale.restart.board import AttemptBoard
from lightning_scale.restart.hangs import PeerHangJudge


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _judge(world: int = 3) -> tuple[PeerHangJudge, Clock]:
    clock = Clock()
    return PeerHangJudge(world, clock=clock), clock


def test_a_rank_behind_its_waiting_peers_is_named_once_every_count_stood_still_for_the_allowance():
    judge, clock = _judge()
    stuck = [Progress(10, True, 5.0), Progress(9, True, 5.0), Progress(10, True, 5.0)]
    assert judge.observe(stuck) == []
    clock.now = 5.0
    assert judge.observe(stuck) == []  # not longer than the allowance yet
    clock.now = 5.5
    assert judge.observe(stuck) == [(1, 5.5)]


def test_nobody_is_named_while_the_leaders_move_when_counts_are_equal_or_in_unwatched_phases():
    judge, clock = _judge()
    for second in range(20):  # rank 1 lags behind, but the others move on: a straggler, not a hang
        clock.now = float(second)
        assert (
            judge.observe([Progress(10 + second, True, 5.0), Progress(9, True, 5.0), Progress(10 + second, True, 5.0)])
            == []
        )
    judge, clock = _judge()
    equal = [Progress(7, True, 5.0)] * 3  # every rank stands still at the same place: no one to blame
    judge.observe(equal)
    clock.now = 60.0
    assert judge.observe(equal) == []
    judge, clock = _judge()
    saving = [Progress(10, True, 5.0), Progress(9, False, 5.0), Progress(10, True, 5.0)]  # rank 1 saves a checkpoint
    judge.observe(saving)
    clock.now = 60.0
    assert judge.observe(saving) == []
    assert judge.observe([None, Progress(1, True, 1.0), Progress(2, True, 1.0)]) == []  # not everyone known yet


def test_the_board_carries_progress_accusations_and_heartbeats_between_parents():
    store, clock = dist.HashStore(), Clock()
    parents = [AttemptBoard(store, rank, 2, clock=clock) for rank in (0, 1)]
    assert parents[0].progress(0) == [None, None]
    beacon = Beacon()
    beacon.mark(watched=True, allowance_s=12.5)
    parents[1].publish_progress(0, beacon.read())
    assert parents[0].progress(0) == [None, Progress(1, True, 12.5)]
    assert not parents[1].accused(0)
    parents[0].accuse(0, 1, "rank 1 made no progress for 13.0 s while the others waited for it")
    assert parents[1].accused(0) and not parents[0].accused(0) and parents[1].failed(0)
    assert parents[0].reasons(0) == ["rank 1 made no progress for 13.0 s while the others waited for it"]
    parents[1].beat()
    assert parents[0].silent_peers(3.0) == []
    clock.now = 4.0
    assert parents[0].silent_peers(3.0) == [1]  # its heartbeat stood still
    parents[1].beat()
    assert parents[0].silent_peers(3.0) == []
    for parent in parents:
        parent.arrive(1)
    assert parents[0].everyone_arrived(1) and not parents[0].everyone_arrived(2)
