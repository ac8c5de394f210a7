"""StepVote: every voting callback's question after a training batch, asked with one collective."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl

from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DivergenceRollback,
    ResumableCheckpoint,
    SpotPreemption,
)
from lightning_scale.callbacks._step_vote import StepVote
from tests import fitting


class Collective:
    """Stands in for the all-reduce across ranks: the other rank's answers are ``others``."""

    def __init__(self, others: list[bool]) -> None:
        self.others = others
        self.calls: list[list[bool]] = []

    def __call__(self, flags: Sequence[bool]) -> list[bool]:
        self.calls.append(list(flags))
        return [mine or theirs for mine, theirs in zip(flags, self.others, strict=True)]


def batch(step: int, epoch: int = 0) -> Any:
    return SimpleNamespace(current_epoch=epoch, global_step=step, world_size=2)


def test_every_ballot_is_cast_once_per_batch_in_one_collective():
    collective = Collective(others=[False, True])
    vote = StepVote(collective)
    asked: list[str] = []
    preemption, budget = object(), object()
    vote.join(preemption, lambda trainer, outputs: asked.append("preemption") or False)
    vote.join(budget, lambda trainer, outputs: asked.append("budget") or False)

    trainer = batch(step=3)
    assert not vote.agreed(preemption, trainer, None, batch_idx=3)
    assert vote.agreed(budget, trainer, None, batch_idx=3)  # the other rank said yes: so does this one
    assert asked == ["preemption", "budget"] and collective.calls == [[False, False]]

    trainer = batch(step=4)
    vote.agreed(budget, trainer, None, batch_idx=4)  # whichever asks first casts every ballot
    vote.agreed(preemption, trainer, None, batch_idx=4)
    assert asked == ["preemption", "budget"] * 2 and len(collective.calls) == 2


def test_a_batch_without_votes_runs_no_collective_and_answers_no():
    collective = Collective(others=[True, True])
    vote = StepVote(collective)
    inside_window, voting = object(), object()
    vote.join(inside_window, lambda trainer, outputs: None)
    vote.join(voting, lambda trainer, outputs: None)
    assert not vote.agreed(voting, batch(step=1), None, batch_idx=1)
    assert collective.calls == []

    vote.join(voting, lambda trainer, outputs: False)  # joining again replaces the ballot
    assert not vote.agreed(inside_window, batch(step=2), None, batch_idx=2)  # no vote of its own: never a yes
    assert vote.agreed(voting, batch(step=2), None, batch_idx=2)
    assert collective.calls == [[False, False]]  # a slot for every ballot, so that every rank sends the same length

    vote.leave(voting)
    vote.leave(inside_window)
    assert not vote.agreed(voting, batch(step=3), None, batch_idx=3)
    assert len(collective.calls) == 1


def test_the_voting_callbacks_of_a_fit_share_the_trainers_vote_and_leave_it_after(tmp_path, tiny_trainer_kwargs):
    joined: list[int] = []

    class Count(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            joined.append(StepVote.of(trainer).voters)

    callbacks = [
        SpotPreemption(),
        CostTracker(price_per_hour=1.0, rightsizing=False),
        BudgetedEarlyStopping(max_cost_usd=1e9),
        DivergenceRollback(),
        ResumableCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_minutes=60.0),  # two voters: timer, snapshots
        Count(),
    ]
    trainer = fitting.fit(callbacks, tiny_trainer_kwargs, max_steps=3)
    assert joined == [5, 5, 5]
    assert StepVote.of(trainer).voters == 0


def started(collective: Collective, log: list[list[bool]]):
    """The collective started without waiting: its answers come when the returned function is called."""

    def start(flags: Sequence[bool]):
        log.append(list(flags))
        answers = collective(flags)
        return lambda: answers

    return start


def on_two(step: int) -> Any:
    return SimpleNamespace(current_epoch=0, global_step=step, world_size=2)


def test_deferred_ballots_alone_wait_for_nothing_and_are_answered_at_their_next_vote():
    collective, starts = Collective(others=[True, False]), []
    vote = StepVote(collective, started(Collective(others=[True, False]), starts))
    notice, timer = object(), object()
    vote.join(notice, lambda trainer, outputs: False, deferred=True)  # the other rank saw a notice
    vote.join(timer, lambda trainer, outputs: False, deferred=True)
    assert not vote.agreed(notice, on_two(1), None, batch_idx=1) and not vote.agreed(timer, on_two(1), None, 1)
    assert collective.calls == [] and starts == [[False, False]]  # started, not waited on
    assert vote.agreed(notice, on_two(2), None, batch_idx=2)  # the yes of batch 1, on every rank at batch 2
    assert not vote.agreed(timer, on_two(2), None, batch_idx=2)
    assert starts == [[False, False], [False, False]]  # the notice's yes is acted on: not cast again (its slot: no)


def test_a_deferred_yes_waits_for_its_ballots_next_voting_batch():
    starts: list[list[bool]] = []
    vote = StepVote(Collective(others=[True]), started(Collective(others=[True]), starts))
    notice = object()
    vote.join(notice, lambda trainer, outputs: None if trainer.global_step % 2 else False, deferred=True)
    assert not vote.agreed(notice, on_two(2), None, batch_idx=0)  # votes after an optimizer step ...
    assert not vote.agreed(notice, on_two(3), None, batch_idx=1)  # ... not inside accumulation: the yes waits
    assert vote.agreed(notice, on_two(4), None, batch_idx=2)
    assert len(starts) == 1


def test_a_ballot_that_cannot_wait_takes_the_deferred_ones_into_its_collective():
    collective, starts = Collective(others=[True, True]), []
    vote = StepVote(collective, started(collective, starts))
    notice, loss = object(), object()
    vote.join(notice, lambda trainer, outputs: False, deferred=True)
    vote.join(loss, lambda trainer, outputs: False)  # a diverged loss: acted on in its own batch
    assert vote.agreed(notice, on_two(1), None, batch_idx=1) and vote.agreed(loss, on_two(1), None, batch_idx=1)
    assert starts == [] and collective.calls == [[False, False]]


def test_on_one_process_a_deferred_ballot_is_answered_in_its_own_batch_without_a_collective():
    collective, starts = Collective(others=[True]), []
    vote = StepVote(collective, started(collective, starts))
    notice, budget = object(), object()
    vote.join(notice, lambda trainer, outputs: True, deferred=True)
    vote.join(budget, lambda trainer, outputs: False, deferred=True)
    alone = SimpleNamespace(current_epoch=0, global_step=1, world_size=1)
    assert vote.agreed(notice, alone, None, batch_idx=1) and not vote.agreed(budget, alone, None, batch_idx=1)
    assert starts == [] and collective.calls == []
