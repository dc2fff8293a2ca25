"""A round's testbed and measurement on the CU: the emulated quotas and link throttles the server sends (the
testbed), the devices' and links' profile when the server asks for one, and what the reply reports of both."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from collapipe_flwr.config import ClusterConfig
from collapipe_flwr.fl.cu.emulation import ThrottledHead, apply_emulation, cu_step_seconds, uplink_bucket, with_cu_step
from collapipe_flwr.fl.cu.local_steps import round_batches
from collapipe_flwr.fl.messages import PROFILE_CU_STEP_S, TrainInstructions, profile_metrics
from collapipe_flwr.fl.round_report import TestbedFigures
from collapipe_flwr.system.profile import ClusterProfile
from collapipe_flwr.testbed.token_bucket import TokenBucket


@dataclass
class RoundTestbed:
    """What this round's testbed and measurement set up: the uplink bucket at R_n, the cores each device's cgroup
    grants, and the devices' profile when the server asked for one."""

    bucket: TokenBucket | None = None
    cores: list[float] | None = None
    profile: ClusterProfile | None = None


def prepare_testbed(session, cfg: ClusterConfig, instructions: TrainInstructions, cluster: int) -> RoundTestbed:
    """Apply the testbed's quotas and link throttles (when the server sends them), then measure the devices and
    links (when asked) at the shape of this round's first batch: measured under the emulation, as the round runs."""
    out = RoundTestbed()
    pipeline = session.live_pipeline()
    emulation = instructions.emulation
    if emulation is not None:
        out.cores = apply_emulation(pipeline, emulation, cluster)
        out.bucket = uplink_bucket(emulation)
    else:
        pipeline.testbed.clear_testbed()
    if instructions.measure:
        batches = round_batches(session.task, cfg, session.examples, instructions.round, cluster)
        first = next(itertools.islice(batches, 1))
        b, seq_len = (int(x) for x in first["input_ids"].shape[:2])
        out.profile = pipeline.measure(b, seq_len, cfg.model.width, repeats=instructions.measure)
    return out


def testbed_figures(testbed: RoundTestbed, head, step_seconds: dict, steps: int, K: int, t: int) -> TestbedFigures:
    """The report's profile (every round: the CU's own seconds per step; devices and links when measured), the
    seconds the uplink held z^enc and the cores the testbed's cgroups granted."""
    waited = head.waited_s if isinstance(head, ThrottledHead) else 0.0
    report = with_cu_step(testbed.profile, K, cu_step_seconds(step_seconds, steps, waited), t)
    lists = profile_metrics(report)
    cu_step_s = float(lists.pop(PROFILE_CU_STEP_S))
    profile = {key: tuple(float(x) for x in values) for key, values in lists.items()}
    cores = tuple(float(c) for c in testbed.cores) if testbed.cores is not None else None
    return TestbedFigures(profile, cu_step_s, float(waited), cores)
