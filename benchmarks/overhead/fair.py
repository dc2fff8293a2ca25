"""Issue 30's fair pipeline figures: one core per device actor, one thread for the CU and the plain model."""

from __future__ import annotations

import contextlib
import statistics

import torch

from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, RuntimeSpec
from overhead.bounds import step_bound
from overhead.cpu_meter import CpuMeter
from overhead.model import DELTAS, SPEC, PlainTrainer, make_model


def fair_figures(batch, warmup: int, steps: int, pin: str, handoff: str = "auto") -> dict[str, float]:
    """Issue 30's fair pipeline figures (``benchmarks/pipeline_overhead.py``'s docstring): every device actor gets
    one core (``pin``) and one torch thread, the CU (embedding, head, driver) one thread, the plain model one
    thread. The trainers' steps alternate, so they see the same background load; medians of ``steps`` steps after
    ``warmup``. With a ``handoff`` other than ``object_store`` (runtime.handoff), S = 2, m = 4 also runs through
    Ray's object store in the same alternation (``fair_step_s_S2_m4_object_store``): the hand-over's gain measured
    within one run."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    plain = PlainTrainer(1)
    samples = _Samples()
    with contextlib.ExitStack() as stack:
        rig = _Rig(stack, pin, handoff)
        for i in range(warmup + steps):
            rig.step(batch, plain, samples if i >= warmup else None)
    torch.set_num_threads(previous)
    for meter in rig.meters.values():  # the warm-up steps out
        meter.totals = {name: values[warmup:] for name, values in meter.totals.items()}
    return samples.figures(rig.meters, rig.compare)


class _Samples:
    """What the steps after the warm-up measured: wall seconds per trainer, the CU's phases of each pipelined step
    (a profile) and S = 2, m = 4 against its compute-bound critical path (:func:`step_bound`)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {"plain": [], "S1_m1": [], "S2_m4": [], "S2_m4_object_store": []}
        self.phases: dict[str, list[dict[str, float]]] = {"S1_m1": [], "S2_m4": []}
        self.bounds: list[dict[str, float]] = []

    def figures(self, meters: dict[str, CpuMeter], compare: bool) -> dict[str, float]:
        times = self.times
        median = {key: statistics.median(values) for key, values in times.items()}
        profile = {
            f"fair_{key}_{name}_s": statistics.median(step[name] for step in steps)
            for key, steps in self.phases.items()
            for name in steps[0]
        }
        cpu = {name: value for key, meter in meters.items() for name, value in meter.medians(f"fair_{key}").items()}
        bound = {f"fair_S2_m4_{name}": statistics.median(b[name] for b in self.bounds) for name in self.bounds[0]}
        return {
            **profile,
            **cpu,
            **bound,
            "device_speedup_S2_m4_bound": bound["fair_S2_m4_bound_s"] / median["S1_m1"],
            "fair_plain_step_s_threads1": median["plain"],
            "fair_step_s_S1_m1": median["S1_m1"],
            "fair_step_s_S2_m4": median["S2_m4"],
            "overhead_ratio_equal_cores": median["S1_m1"] / median["plain"],
            "device_speedup_S2_m4": median["S2_m4"] / median["S1_m1"],
            # the same two ratios step by step (each iteration's steps ran seconds apart), then their median: a
            # machine whose speed drifts over minutes moves these less than a ratio of medians
            "overhead_ratio_equal_cores_paired": statistics.median(
                one / plain for one, plain in zip(times["S1_m1"], times["plain"], strict=True)
            ),
            "device_speedup_S2_m4_paired": statistics.median(
                two / one for two, one in zip(times["S2_m4"], times["S1_m1"], strict=True)
            ),
            **(
                {
                    "fair_step_s_S2_m4_object_store": median["S2_m4_object_store"],
                    "device_speedup_S2_m4_object_store": median["S2_m4_object_store"] / median["S1_m1"],
                }
                if compare
                else {}
            ),
        }


class _Rig:
    """The pipelines the fair figures alternate (S = 1 and S = 2 with ``handoff``; S = 2 through the object store
    when it is compared), entered on ``stack``, and a :class:`CpuMeter` for each of the first two."""

    def __init__(self, stack: contextlib.ExitStack, pin: str, handoff: str) -> None:
        def runtime(mode: str) -> ClusterRuntime:
            spec = RuntimeSpec(backend="ray", precision="fp32", pin_threads=pin, handoff=mode)
            return ClusterRuntime(spec, actor_threads=1)

        self.compare = handoff != "object_store"
        one, two = make_model(), make_model()
        self.head_one, self.head_two = LocalHead(one.head, SPEC), LocalHead(two.head, SPEC)
        self.pipe_one = stack.enter_context(
            ClusterPipeline(one.embedding, one.blocks, DELTAS[1], SPEC, runtime=runtime(handoff))
        )
        self.pipe_two = stack.enter_context(
            ClusterPipeline(two.embedding, two.blocks, DELTAS[2], SPEC, runtime=runtime(handoff))
        )
        pipes = {"S1": self.pipe_one, "S2": self.pipe_two}
        # The object-store pipeline exists only when it is compared: idle, its actors would still hold processes.
        if self.compare:
            three = make_model()
            self.head_three = LocalHead(three.head, SPEC)
            self.pipe_three = stack.enter_context(
                ClusterPipeline(three.embedding, three.blocks, DELTAS[2], SPEC, runtime=runtime("object_store"))
            )
            pipes["S2_object_store"] = self.pipe_three
        print(f"handoff: {self.pipe_two.stages.handoff}")
        pids = {name: {p.pid for p in pipe.stages.processes().values()} for name, pipe in pipes.items()}
        every_actor = set().union(*pids.values())
        self.meters = {
            key: CpuMeter({"devices": pids[key[:2]], "idle_actors": every_actor - pids[key[:2]]})
            for key in ("S1_m1", "S2_m4")
        }

    def step(self, batch, plain: PlainTrainer, samples: _Samples | None) -> None:
        """One step of each trainer in turn; ``samples`` (None in the warm-up) keeps what they measured."""
        plain_s = plain.step(batch)
        self.meters["S1_m1"].start()
        one_t = self.pipe_one.train_step(batch, 1, self.head_one).timings
        self.meters["S1_m1"].stop()
        self.meters["S2_m4"].start()
        two_t = self.pipe_two.train_step(batch, 4, self.head_two).timings
        self.meters["S2_m4"].stop()
        three_s = self.pipe_three.train_step(batch, 4, self.head_three).timings.total if self.compare else 0.0
        if samples is None:
            return
        for key, value in (("plain", plain_s), ("S1_m1", one_t.total), ("S2_m4", two_t.total)):
            samples.times[key].append(value)
        samples.times["S2_m4_object_store"].append(three_s)
        for key, t in (("S1_m1", one_t), ("S2_m4", two_t)):
            busy = {f"device{k}_compute": c for k, c in t.device_compute.items()}
            samples.phases[key].append({**t.phases(), **busy})
        samples.bounds.append(step_bound(self.pipe_two.traces(), two_t, sum(one_t.device_compute.values())))
