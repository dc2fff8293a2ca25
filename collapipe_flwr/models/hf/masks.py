"""The attention-mask builders the HF models themselves call, in one place.

transformers exports them only from the internal module ``transformers.masking_utils`` (not from the
top-level package). We import them anyway, on purpose: a block must build its mask exactly as the original
forward pass does (padding, causality, sliding windows, the attention implementation's own format: a
4-D float/bool mask, ``None`` when SDPA can use ``is_causal``, a flex BlockMask), and re-implementing that
would drift from the originals. pyproject pins transformers below the next major for such imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)

MaskFn = Callable[..., Any]


def bidirectional_mask(config: Any, hidden: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The encoder's padding mask, as ``BertModel._create_attention_masks`` builds it (is_decoder=False)."""
    return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)


def causal_mask(
    config: Any, hidden: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, sliding: bool
) -> Any:
    """The decoder's causal (optionally sliding-window) padding mask, as the HF decoder models build it for
    training (no cache)."""
    build: MaskFn = create_sliding_window_causal_mask if sliding else create_causal_mask
    return build(
        config=config, inputs_embeds=hidden, attention_mask=attention_mask, cache=None, position_ids=position_ids
    )
