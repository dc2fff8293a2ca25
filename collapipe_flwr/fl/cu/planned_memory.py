"""C7 on the CU as the planner computed it: how many TEBs each device may hold under this round's plan.

The server plans with the workload's gamma_0 (``system/workload.py``: weights, gradients, optimizer slots and the
activations autograd saves, counted on the real blocks); the CU's own per-block estimate
(``pipeline/memory.py``) is an upper bound that can be up to 3x the measured figure, so a device sized to hold
two blocks by the planner would hold one by the estimate, and a plan the planner found feasible would be
refused. When the round's instructions carry Sub-1's inputs, the CU checks delta against the planner's caps
instead (the same model that chose delta); the kernel's memory limit on the testbed is what enforces C7 for real.
"""

from __future__ import annotations

from collections.abc import Sequence

from collapipe_flwr.fl.messages import TrainInstructions


def planned_caps(instructions: TrainInstructions, delta: Sequence[int], m: int) -> tuple[int, ...] | None:
    """Blocks device k may hold under C7 for partition ``delta`` with m micro-batches, from the planner's cluster
    model of this round (1F1B: stage by stage); None when no Sub-1 inputs came with the round."""
    if instructions.replan is None:
        return None
    model = instructions.replan.model
    if len(delta) != model.K:
        return None
    return tuple(int(c) for c in model.stage_memory_cap(list(delta), int(m)))
