"""A pipeline's checkpoint state: the stages' weights gathered into the unsplit model's state dict and split back, the
optimizer states kept per pipeline rank. No Lightning here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_scale import distributed
from lightning_scale.errors import ConfigurationError

__all__ = ["gather_model_state", "gather_optimizer_state", "stage_model_state", "stage_optimizer_states"]


def gather_model_state(local: dict[str, Any], group: Any) -> dict[str, Any]:
    """The unsplit model's state dict, from every rank of the pipeline ``group`` holding its stages' ``local`` part."""
    merged: dict[str, Any] = {}
    for part in distributed.all_gather_object(local, group=group):
        merged.update(part)
    return merged


def stage_model_state(full: Mapping[str, Any], local: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    """The entries of the unsplit model's state dict ``full`` that this rank's ``local`` state dict holds.

    Raises ``KeyError`` when ``strict`` and ``full`` lacks some of them.
    """
    missing = [key for key in local if key not in full]
    if strict and missing:
        raise KeyError(f"The checkpoint lacks {missing[:5]} of this pipeline stage; was it written by this model?")
    return {key: value for key, value in full.items() if key in local}


def gather_optimizer_state(local: dict[str, Any], group: Any) -> dict[str, Any]:
    """Every pipeline rank's optimizer state, in rank order, under ``pipeline_ranks``."""
    return {"pipeline_ranks": distributed.all_gather_object(local, group=group)}


def stage_optimizer_states(saved: list[dict[str, Any]], pipeline_size: int, pipeline_rank: int) -> list[Any]:
    """This rank's optimizer states from the checkpoint's ``saved`` ones (one per optimizer, as
    :func:`gather_optimizer_state` wrote them); refuses states written by another number of pipeline ranks."""
    states = [state["pipeline_ranks"] for state in saved]
    if any(len(ranks) != pipeline_size for ranks in states):
        raise ConfigurationError(
            f"The checkpoint's optimizer states come from {len(states[0])} pipeline ranks, this run has "
            f"{pipeline_size}; resume with the same pipeline_size, or load only the weights (the unsplit state_dict)."
        )
    return [ranks[pipeline_rank] for ranks in states]
