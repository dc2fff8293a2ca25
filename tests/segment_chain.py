"""A split model run as the pipeline's stages run it, in one process: each segment of ``delta`` from a detached leaf,
the gradient sent back segment by segment."""

from __future__ import annotations

from collapipe_flwr.models.split import segment_bounds


def segments_forward(split, batch, delta):
    """(the embedding's output, z_enc as a detached leaf, the chain of (leaf, output) per segment)."""
    mask = batch["attention_mask"]
    embedded = split.embedding(batch["input_ids"])
    x, chain = embedded, []
    for _, a, b in segment_bounds(delta):
        leaf = x.detach().requires_grad_(True)
        x = leaf
        for block in split.blocks[a:b]:
            x = block(x, mask)
        chain.append((leaf, x))
    return embedded, x.detach().requires_grad_(True), chain


def chain_backward(z_enc, chain):
    """z_enc's gradient (after the head's backward) sent back through ``chain``; the first leaf's gradient."""
    grad = z_enc.grad
    for leaf, out in reversed(chain):
        out.backward(grad)
        grad = leaf.grad
    return grad
