"""The device speed-up with every device an emulated one under the testbed's cgroup CPU quota."""

from __future__ import annotations

import contextlib
import statistics

import torch

from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, RuntimeSpec
from collapipe_flwr.system.profile import DeviceEmulation
from overhead.model import DELTAS, SPEC, make_model


def quota_figures(batch, warmup: int, steps: int, device_cores: float, pin: str, handoff: str) -> dict[str, float]:
    """The device speed-up with every device an emulated one of ``device_cores`` cores (the testbed's cgroup CPU
    quota, ``set_testbed``), so that S = 2 devices leave the CU and Ray a share of their own, as a CU's own box
    would: S = 2, m = 4 over S = 1, m = 1, each device actor pinned to its own core under the same quota, the two
    pipelines' steps alternating. ``fair_figures``' one-core figure cannot give the CU that share on a 2-core host
    (its profile: the devices' 0.97 core-seconds, the CU's 0.08 and Ray's 0.055 share the two cores). Raises
    TestbedError (one line) where cgroup quotas cannot be used."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = RuntimeSpec(backend="ray", precision="fp32", pin_threads=pin, handoff=handoff)
    one, two = make_model(), make_model()
    head_one, head_two = LocalHead(one.head, SPEC), LocalHead(two.head, SPEC)
    times: dict[str, list[float]] = {"S1_m1": [], "S2_m4": []}
    granted: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        pipes = {}
        for key, S in (("S1_m1", 1), ("S2_m4", 2)):
            model = one if S == 1 else two
            pipe = stack.enter_context(
                ClusterPipeline(
                    model.embedding, model.blocks, DELTAS[S], SPEC, runtime=ClusterRuntime(spec, actor_threads=1)
                )
            )
            stack.callback(pipe.testbed.clear_testbed)  # the cgroups go before the actors do
            emulation = DeviceEmulation((device_cores,) * S, (0.0,) * S, (0.0,) * S)
            cores = pipe.testbed.set_testbed(emulation, f"collapipe-bench-{key}-")
            granted.update({f"quota_{key}_device{k}_cores": c for k, c in cores.items()})
            pipes[key] = pipe
        for i in range(warmup + steps):
            for key, head, m in (("S1_m1", head_one, 1), ("S2_m4", head_two, 4)):
                seconds = pipes[key].train_step(batch, m, head).timings.total
                if i >= warmup:
                    times[key].append(seconds)
    torch.set_num_threads(previous)
    median = {key: statistics.median(values) for key, values in times.items()}
    return {
        **granted,
        "quota_device_cores": device_cores,
        "quota_step_s_S1_m1": median["S1_m1"],
        "quota_step_s_S2_m4": median["S2_m4"],
        "device_speedup_S2_m4_quota": median["S2_m4"] / median["S1_m1"],
    }
