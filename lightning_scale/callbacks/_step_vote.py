"""One collective per training batch for every callback that must decide the same thing on every rank.

``SpotPreemption`` (a notice), ``ResumableCheckpoint`` (its ``every_n_minutes`` timer and its memory snapshots'
cadence), ``BudgetedEarlyStopping`` (the budget) and ``DivergenceRollback`` (a bad loss) each ask all ranks a yes/no
question after an optimizer step. Asked one by one, that is one all-reduce each, every step: under DDP each costs a
round trip between the ranks. Here each callback joins the Trainer's :class:`StepVote` with a ballot; the first of
them to ask in a batch casts every ballot and asks all questions with one all-reduce
(:func:`~lightning_scale.distributed.any_rank_each`), and each reads its own answer.

A question that can wait a step (``deferred``: a preemption notice with its grace period, a timer, a budget) costs
no wait at all on several processes: when only such ballots vote in a batch, their all-reduce is started without
waiting (:func:`~lightning_scale.distributed.any_rank_each_start`) and answered at the ballot's next voting batch
(the next optimizer step), by when that step's work has long covered its round trip, so no rank waits for the slowest
one to reach the vote. Every rank reads the same answers at the same batch, so all still act at the same step, one
step later. When a batch has a question that cannot wait (a diverged loss), the deferred ones ride in its collective
and are answered at once. A ballot whose yes is delivered is not cast again in that batch (its callback acts on it).

A ballot runs exactly once per training batch, whichever callback asked first: it reads its rank's state (and may
update it, e.g. record the batch's loss) and returns the rank's answer, or ``None`` when its callback does not vote
on this batch. Whether a callback votes must be the same on every rank (it depends on the step, never on a rank's
own state), since the collective runs only when some ballot votes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT

from lightning_scale import distributed

__all__ = ["Ballot", "StepVote"]

Ballot = Callable[[pl.Trainer, STEP_OUTPUT], bool | None]
"""A rank's answer after a training batch (``trainer``, the batch's ``outputs``); ``None``: no vote this batch."""

_VOTES: weakref.WeakKeyDictionary[pl.Trainer, StepVote] = weakref.WeakKeyDictionary()


class StepVote:
    """The Trainer's per-batch vote: every joined callback's question in one collective.

    Args:
        any_rank_each: The collective: for each position, whether any rank said yes.
        any_rank_each_start: The same collective, started without waiting (returns the function that waits for the
            answers); ``None``: every question is answered in its own batch.
    """

    def __init__(
        self,
        any_rank_each: Callable[[Sequence[bool]], list[bool]] = distributed.any_rank_each,
        any_rank_each_start: Callable[[Sequence[bool]], Callable[[], list[bool]]] | None = (
            distributed.any_rank_each_start
        ),
    ) -> None:
        self._any_rank_each, self._start = any_rank_each, any_rank_each_start
        self._ballots: dict[int, Ballot] = {}  # by id() of the callback, in join order (the same on every rank)
        self._deferred: set[int] = set()
        self._batch: tuple[int, int, int] | None = None
        self._answers: dict[int, bool] = {}
        self._pending: tuple[list[int], Callable[[], list[bool]]] | None = None
        self._held: dict[int, bool] = {}  # deferred answers, until their ballot votes again

    @classmethod
    def of(cls, trainer: pl.Trainer) -> StepVote:
        """The vote of ``trainer`` (created on first use)."""
        if trainer not in _VOTES:
            _VOTES[trainer] = cls()
        return _VOTES[trainer]

    @property
    def voters(self) -> int:
        """How many callbacks vote."""
        return len(self._ballots)

    def join(self, voter: object, ballot: Ballot, deferred: bool = False) -> None:
        """Ask ``ballot`` after every training batch from now on (again: replaces the earlier one); ``deferred``: its
        answer may come a batch later on several processes."""
        self._ballots[id(voter)] = ballot
        if deferred:
            self._deferred.add(id(voter))
        else:
            self._deferred.discard(id(voter))
        self._batch = None

    def leave(self, voter: object) -> None:
        self._ballots.pop(id(voter), None)
        self._deferred.discard(id(voter))
        self._held.pop(id(voter), None)
        self._batch = None
        if not self._ballots:
            self._late_answers()  # the collective every rank started: finished before the fit's process group goes

    def agreed(self, voter: object, trainer: pl.Trainer, outputs: STEP_OUTPUT, batch_idx: int) -> bool:
        """Whether any rank answered yes to ``voter``'s ballot on this batch (``False`` when it did not vote); a
        deferred ballot's yes may be its answer from the batch before."""
        batch = (trainer.current_epoch, batch_idx, trainer.global_step)
        if batch != self._batch:
            self._batch = batch
            self._answers = self._cast(trainer, outputs)
        return self._answers.get(id(voter), False)

    def _late_answers(self) -> dict[int, bool]:
        if self._pending is None:
            return {}
        keys, wait = self._pending
        self._pending = None
        return {key: yes for key, yes in zip(keys, wait(), strict=True) if key in self._ballots}

    def _cast(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> dict[int, bool]:
        # deferred answers wait for their ballot's next voting batch (with gradient accumulation, the next optimizer
        # step, not the next batch); a yes is acted on then, and the ballot is not cast again in that batch
        self._held.update(self._late_answers())
        answers: dict[int, bool | None] = {}
        delivered: dict[int, bool] = {}
        for key, ballot in self._ballots.items():
            answer = ballot(trainer, outputs)
            if answer is not None and key in self._held and self._held.pop(key):
                delivered[key], answer = True, None
            answers[key] = answer
        voting = {key for key, answer in answers.items() if answer is not None}
        if not voting:
            return delivered
        if trainer.world_size == 1:  # the answers are this rank's: no collective to ask
            return {**delivered, **{key: bool(answers[key]) for key in voting}}
        flags = [bool(answer) for answer in answers.values()]  # a slot for every ballot: the same length everywhere
        if voting <= self._deferred and self._start is not None:
            self._pending = (list(answers), self._start(flags))
            return delivered
        agreed = dict(zip(answers, self._any_rank_each(flags), strict=True))
        return {**delivered, **{key: agreed[key] for key in voting}}
