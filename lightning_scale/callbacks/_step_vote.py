"""One collective per training batch for every callback that must decide the same thing on every rank.

``SpotPreemption`` (a notice), ``ResumableCheckpoint`` (its ``every_n_minutes`` timer), ``BudgetedEarlyStopping``
(the budget) and ``DivergenceRollback`` (a bad loss) each ask all ranks a yes/no question after an optimizer step.
Asked one by one, that is one all-reduce each, every step: under DDP each costs a round trip between the ranks. Here
each callback joins the Trainer's :class:`StepVote` with a ballot; the first of them to ask in a batch casts every
ballot and asks all questions with one all-reduce (:func:`~lightning_scale.distributed.any_rank_each`), and each
reads its own answer.

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
    """

    def __init__(self, any_rank_each: Callable[[Sequence[bool]], list[bool]] = distributed.any_rank_each) -> None:
        self._any_rank_each = any_rank_each
        self._ballots: dict[int, Ballot] = {}  # by id() of the callback, in join order (the same on every rank)
        self._batch: tuple[int, int, int] | None = None
        self._answers: dict[int, bool] = {}

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

    def join(self, voter: object, ballot: Ballot) -> None:
        """Ask ``ballot`` after every training batch from now on (again: replaces the earlier one)."""
        self._ballots[id(voter)] = ballot
        self._batch = None

    def leave(self, voter: object) -> None:
        self._ballots.pop(id(voter), None)
        self._batch = None

    def agreed(self, voter: object, trainer: pl.Trainer, outputs: STEP_OUTPUT, batch_idx: int) -> bool:
        """Whether any rank answered yes to ``voter``'s ballot on this batch (``False`` when it did not vote)."""
        batch = (trainer.current_epoch, batch_idx, trainer.global_step)
        if batch != self._batch:
            self._batch = batch
            self._answers = self._cast(trainer, outputs)
        return self._answers.get(id(voter), False)

    def _cast(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> dict[int, bool]:
        answers = {key: ballot(trainer, outputs) for key, ballot in self._ballots.items()}
        if all(answer is None for answer in answers.values()):
            return {}
        agreed = self._any_rank_each([bool(answer) for answer in answers.values()])  # a slot for every ballot
        return {key: yes for (key, answer), yes in zip(answers.items(), agreed, strict=True) if answer is not None}
