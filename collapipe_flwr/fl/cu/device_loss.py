"""A device lost during a CU's round: Sub-1 again over the devices left, with the round's starting weights."""

from __future__ import annotations

import logging

from collapipe_flwr.dssra.replan import replan_without
from collapipe_flwr.errors import DeviceFailure, InfeasiblePlanError
from collapipe_flwr.fl.messages import TrainInstructions

log = logging.getLogger(__name__)


def replan_after(
    failure: DeviceFailure, session, parts: dict, instructions: TrainInstructions, lost: list[int], cluster: int
) -> int:
    """Device ``failure.device`` is gone: Sub-1 over the devices left (the server's inputs for this round),
    the round's starting weights (``parts``) back on the new partition; adds the device to ``lost`` and returns
    the new m. Re-raises when the failed device is unknown, no inputs came with the round, or no partition fits
    the devices left."""
    if failure.device is None or instructions.replan is None or failure.device in lost or session.pipeline is None:
        raise failure
    lost.append(int(failure.device))
    try:
        replanned = replan_without(instructions.replan, lost)
    except InfeasiblePlanError as err:
        raise DeviceFailure(f"{failure}; no re-plan over the devices left: {err}", device=failure.device) from None
    log.warning(
        "cluster %s round %s: %s; re-planned over the devices left: S=%s m=%s delta=%s",
        cluster,
        instructions.round,
        failure,
        replanned.S,
        replanned.m,
        list(replanned.delta),
    )
    session.recover(parts, replanned.delta, lost)
    return replanned.m
