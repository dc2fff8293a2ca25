"""A device lost during a CU's round: Sub-1 again over the devices left, with the round's starting weights; and a
later round whose plan gives blocks to a device lost before: Sub-1 over the devices left from the start."""

from __future__ import annotations

import logging
from collections.abc import Sequence

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


def plan_without_lost(
    instructions: TrainInstructions, gone: Sequence[int], lost: list[int], reasons: list[str], cluster: int
) -> tuple[tuple[int, ...], int]:
    """The round's (delta, m), kept off the devices this CU lost in earlier rounds (``gone``: never used again). The
    plan's own when it gives them nothing; else Sub-1 over the devices left, and every ``gone`` device joins
    ``lost`` (reason "") for this round's report and its re-plans. Without Sub-1's inputs the plan is kept."""
    plan = instructions.plan
    used = [k for k in gone if plan.delta[k] or k in plan.user_devices]
    if not used or instructions.replan is None:
        return tuple(plan.delta), plan.m
    try:
        replanned = replan_without(instructions.replan, gone)
    except InfeasiblePlanError as err:
        raise DeviceFailure(
            f"cluster {cluster}: device(s) {used} were lost in an earlier round; no re-plan over the devices left: "
            f"{err}",
            device=used[0],
        ) from None
    log.warning(
        "cluster %s round %s: the plan uses device(s) %s lost in an earlier round; re-planned over the devices left: "
        "S=%s m=%s delta=%s",
        cluster,
        instructions.round,
        used,
        replanned.S,
        replanned.m,
        list(replanned.delta),
    )
    lost.extend(int(k) for k in gone)
    reasons.extend("" for _ in gone)
    return tuple(replanned.delta), replanned.m
