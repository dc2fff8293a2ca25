"""What a round's local steps leave behind on the CU: the loss of each step, the examples seen, the seconds of
each phase of the GPipe step and each device's compute and D2D link seconds, summed over the steps."""

from __future__ import annotations

from typing import NamedTuple

from collapipe_flwr.pipeline.timings import StepResult
from collapipe_flwr.pipeline.virtual_clock import StepCalls


class StepLog(NamedTuple):
    """The round's steps so far: per-step losses (the plain model's mean loss), examples, seconds per phase
    (embed, forward, head, backward, update, total), compute seconds per device k of the cluster,
    (``device_link``) the seconds device k's outgoing D2D link held its hand-overs (the testbed's token bucket) and
    (``device_cpu``) the CPU seconds device k's own process spent over the steps (``StageSeconds.cpu``).

    Data-parallel rounds (VanillaFL's D users, ``fl/cu/data_parallel.py``) also carry each user's measured
    seconds (``user_seconds``, user d's steps on its own device), the memory report of every device that held the
    model (``memory``, one entry per user device, read right after that user's steps), each user's hand-over
    seconds (``user_handover_seconds``: the model moved to its device and its start state loaded, its model read
    back into the CU's sum) and the CU's final average of the users' states (``average_seconds``).

    For the virtual clock (``pipeline/virtual_clock.py``): ``calls``, each step's calls with their thread CPU
    seconds (:class:`StepCalls`); a data-parallel round keeps each user's apart (``user_calls``), since its users
    train at once on devices of their own."""

    losses: list[float]
    examples: int
    seconds: dict[str, float]
    device_compute: list[float]
    user_seconds: tuple[float, ...] = ()
    memory: tuple[dict, ...] = ()
    user_handover_seconds: tuple[float, ...] = ()
    average_seconds: float = 0.0
    device_link: tuple[float, ...] = ()
    device_cpu: tuple[float, ...] = ()
    calls: tuple[StepCalls, ...] = ()
    user_calls: tuple[tuple[StepCalls, ...], ...] = ()

    @classmethod
    def empty(cls, num_devices: int) -> StepLog:
        zeros = (0.0,) * num_devices
        return cls([], 0, {}, [0.0] * num_devices, device_link=zeros, device_cpu=zeros)

    def add(self, result: StepResult, examples: int) -> StepLog:
        """This log with one more step of ``examples`` examples."""
        seconds = dict(self.seconds)
        for phase, sec in result.timings.phases().items():
            seconds[phase] = seconds.get(phase, 0.0) + sec
        compute = list(self.device_compute)
        for k, sec in result.timings.device_compute.items():  # {device index k: compute seconds this step}
            compute[int(k)] += float(sec)
        link = list(self.device_link) or [0.0] * len(compute)
        for k, sec in result.timings.device_link.items():  # {device index k: D2D link seconds this step}
            link[int(k)] += float(sec)
        cpu = list(self.device_cpu) or [0.0] * len(compute)
        for k, sec in result.timings.device_cpu.items():  # {device index k: its process's CPU seconds this step}
            cpu[int(k)] += float(sec)
        t = result.timings
        step = StepCalls(tuple((int(k), tuple(c)) for k, c in t.device_calls.items()), t.cu_cpu, t.head_cpu)
        return StepLog(
            [*self.losses, float(result.loss)],
            self.examples + int(examples),
            seconds,
            compute,
            device_link=tuple(link),
            device_cpu=tuple(cpu),
            calls=(*self.calls, step),
        )
