"""The parents' links: a parent that ends, however it ends, is seen by the other end at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch.distributed as dist

from lightning_scale.restart.board import AttemptBoard
from lightning_scale.restart.links import ParentLinks

_PEER = """
import sys, time
from lightning_scale.restart.links import ParentLinks
links = ParentLinks(int(sys.argv[2]), 3, "127.0.0.1")
links.connect(int(sys.argv[1]))
print("connected", flush=True)
time.sleep(600)
"""


def _lost_within(links: ParentLinks, expected: list[int], seconds: float) -> float:
    started = time.monotonic()
    while links.lost() != expected:
        assert time.monotonic() - started < seconds, links.lost()
        time.sleep(0.01)
    return time.monotonic() - started


def test_rank_0_sees_a_killed_parent_at_once_and_only_that_one():
    zero = ParentLinks(0, 3, "127.0.0.1")
    peers = {
        rank: subprocess.Popen([sys.executable, "-c", _PEER, str(zero.port), str(rank)], stdout=subprocess.PIPE)
        for rank in (1, 2)
    }
    try:
        for peer in peers.values():
            assert peer.stdout is not None and peer.stdout.readline() == b"connected\n"
        assert zero.lost() == []
        os.kill(peers[2].pid, signal.SIGKILL)
        assert _lost_within(zero, [2], 5.0) < 1.0  # a heartbeat would take peer_timeout_s (2 s) at the least
        assert zero.lost() == [2]
    finally:
        for peer in peers.values():
            peer.kill()
            peer.wait()
        zero.close()
        zero.close()  # safe twice


def test_a_parent_sees_rank_0s_parent_end_and_a_forked_copy_does_not_hold_the_link_open():
    zero = ParentLinks(0, 2, "127.0.0.1")
    one = ParentLinks(1, 2, "127.0.0.1")
    one.connect(zero.port)
    assert zero.lost() == [] and one.lost() == []
    child = os.fork()
    if child == 0:  # what the supervisor's child does first: drop its copies of the parent's links
        zero.close()
        one.close()
        time.sleep(5)
        os._exit(0)
    try:
        zero.close()  # rank 0's parent ends; its child (above) lives on
        assert _lost_within(one, [0], 5.0) < 1.0
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        one.close()


def test_a_parent_that_said_it_ended_with_a_final_code_is_not_silent():
    clock = [0.0]
    store = dist.HashStore()
    parents = [AttemptBoard(store, rank, 2, clock=lambda: clock[0]) for rank in (0, 1)]
    parents[1].beat()
    assert parents[0].silent_peers(2.0) == []
    parents[1].say_final()
    clock[0] = 10.0
    assert parents[0].silent_peers(2.0) == [] and parents[0].said_final(1) and not parents[1].said_final(0)
    assert parents[0].gone() == []
    parents[0].say_gone(1)
    assert parents[1].gone() == [1]
