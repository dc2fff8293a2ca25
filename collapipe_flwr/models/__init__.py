"""Models split the way CollaPipe splits them: embedding (CU) | L encoder blocks (devices) | head (server)."""

from collapipe_flwr.models.split import (
    SplitModel,
    TaskHead,
    concat_segments,
    renumber_blocks,
    segment_bounds,
    validate_partition,
)

__all__ = ["SplitModel", "TaskHead", "concat_segments", "renumber_blocks", "segment_bounds", "validate_partition"]
