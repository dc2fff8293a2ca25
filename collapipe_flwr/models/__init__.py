"""Models split the way CollaPipe splits them: embedding (CU) | L encoder blocks (devices) | head (server)."""

from collapipe_flwr.models.split import (
    SplitModel,
    concat_segments,
    encoder_state_dict,
    num_segments,
    segment_bounds,
    validate_partition,
)

__all__ = ["SplitModel", "concat_segments", "encoder_state_dict", "num_segments", "segment_bounds", "validate_partition"]
