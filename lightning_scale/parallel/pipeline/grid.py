"""Where a rank sits among ``world_size = replicas x pipeline_size`` ranks: which pipeline, which stage rank. No
Lightning here."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_scale.errors import ConfigurationError

__all__ = ["PipelineGrid"]


@dataclass(frozen=True)
class PipelineGrid:
    """The ``(replica, pipeline rank)`` grid of the job's ranks, row major: consecutive ranks form one pipeline.

    Examples:
        >>> grid = PipelineGrid(world_size=4, global_rank=3, pipeline_size=2)
        >>> grid.replicas, grid.replica, grid.pipeline_rank
        (2, 1, 1)
    """

    world_size: int
    global_rank: int
    pipeline_size: int  # ranks per pipeline

    def __post_init__(self) -> None:
        if self.world_size % self.pipeline_size:
            raise ConfigurationError(
                f"pipeline_size={self.pipeline_size} does not divide the world size {self.world_size}; choose a "
                "divisor (--trainer.strategy.pipeline_size), the rest becomes data parallel replicas."
            )

    @property
    def replicas(self) -> int:
        """Pipeline replicas (the data parallel size)."""
        return self.world_size // self.pipeline_size

    @property
    def pipeline_rank(self) -> int:
        """This rank's place in its pipeline."""
        return self.global_rank % self.pipeline_size

    @property
    def replica(self) -> int:
        """The pipeline this rank belongs to (its data parallel rank)."""
        return self.global_rank // self.pipeline_size
