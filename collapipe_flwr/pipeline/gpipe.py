"""GPipe's step on one cluster's stages (paper Section III.B steps 3-6, Fig. 3, Algorithm 1 lines 5-22).

Forward in the GPipe clock order (``schedule.forward_cycles``): the CU embeds micro-batch i, stage k runs it
after stage k-1 (stage k on micro-batch i while k+1 is on i-1); the head (``HeadFn``: the server's decoder over
the data plane, or ``LocalHead``) gets z^enc of all m micro-batches in ONE call, updates itself and returns
dL/dz^enc per micro-batch; backward in the reverse clock order; the CU back-propagates each micro-batch into
the embedding. Every stage holds all m micro-batches' activations when the head runs.

Each stage's optimizer step is submitted right behind its last backward (a device runs its calls in the order
they were submitted), so stage k updates while stages below it and the CU's embedding are still back-propagating
(it needs only its own gradients, complete by then); :meth:`.stage.Stage.step` refuses to update a stage whose
backward did not run for every micro-batch, so a failed step never applies part of its gradients.
"""

from __future__ import annotations

import time
from typing import Any

from collapipe_flwr.accelerator import to_host
from collapipe_flwr.pipeline.cu_embedding import CuEmbedding
from collapipe_flwr.pipeline.executors import Stages
from collapipe_flwr.pipeline.head import HeadFn, MicroHead
from collapipe_flwr.pipeline.schedule import backward_cycles, forward_cycles


def gpipe_step(
    stages: Stages, S: int, cu: CuEmbedding, micro: list[dict], head: HeadFn | MicroHead, lr_factor: float
) -> tuple[float, dict[str, float], list[Any]]:
    """Forward, one head call, backward over S stages and m = len(micro) micro-batches, each stage's update
    submitted behind its backward (module docstring); returns the step loss, the seconds of its phases (forward,
    head, backward; the embedding's in ``cu.seconds``) and the handles of the S stages' updates (each stage's
    compute seconds, :meth:`.stage.Stage.step`). ``head`` is called once with all m z^enc (a ``HeadFn``; a head
    that only takes micro-batches one at a time raises TypeError there)."""
    t0 = time.perf_counter()
    m = len(micro)
    masks = [stages.put(mb["attention_mask"]) for mb in micro]
    out: dict[tuple[int, int], Any] = {}  # (i, k) -> stage k's output handle (a value or an ObjectRef)
    for cycle in forward_cycles(m, S):
        for i, k in cycle:
            x = cu.forward(i, micro[i]) if k == 0 else out[(i, k - 1)]
            out[(i, k)] = stages.submit_forward(k, i, x, masks[i])
    z_enc = [to_host(stages.get(out[(i, S - 1)], S - 1)) for i in range(m)]  # the head is across a wire
    t_fwd = time.perf_counter()
    if not callable(head):
        raise TypeError(
            f"pipeline.schedule=gpipe needs a head called with all m micro-batches' z^enc at once (HeadFn: LocalHead, "
            f"DecoderClient), not {type(head).__name__}"
        )
    loss, grads = head(z_enc, micro, float(lr_factor))
    t_head = time.perf_counter()
    if len(grads) != m:
        raise ValueError(f"the head returned {len(grads)} gradients for {m} micro-batches")
    back: dict[tuple[int, int], Any] = {}
    for cycle in backward_cycles(m, S):
        for i, k in cycle:
            g = grads[i] if k == S - 1 else back[(i, k + 1)]
            back[(i, k)] = stages.submit_backward(k, i, g)
    updates = [stages.submit_step(k, float(lr_factor)) for k in range(S)]  # each behind its own backward
    for i in reversed(range(m)):
        cu.backward(i, stages.get(back[(i, 0)], 0))
    t_bwd = time.perf_counter()
    return float(loss), {"forward": t_fwd - t0, "head": t_head - t_fwd, "backward": t_bwd - t_head}, updates
