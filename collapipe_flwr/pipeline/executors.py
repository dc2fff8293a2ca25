"""Where the stages run: in this process (``LocalStages``) or one Ray actor per device (``RayStages``).

Both offer ``submit(stage, method, *args) -> handle`` and ``resolve(handle, stage) -> value``. A handle
may be passed as an argument of a later ``submit``: locally it is the value itself, on Ray an ObjectRef,
so stage k+1 starts on micro-batch i as soon as stage k finishes it, without a round trip through the
CU, while stage k goes on with micro-batch i+1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.stage import Stage


START_TIMEOUT_S = 120.0


class LocalStages:
    """Stages as plain objects in this process; calls run immediately, in submission order."""

    backend = "local"

    def __init__(self, specs: Sequence[tuple[int, nn.ModuleList, dict | None, float]], optimizer: OptimizerSpec) -> None:
        self.device_indices = [k for k, _, _, _ in specs]
        self.stages = [Stage(k, seg, optimizer, optimizer_state=st, slowdown=slow) for k, seg, st, slow in specs]

    def new_step(self) -> None:
        pass

    def submit(self, stage: int, method: str, *args):
        return getattr(self.stages[stage], method)(*args)

    def resolve(self, handle, stage: int):
        return handle

    def shutdown(self) -> None:
        self.stages = []


class StageActor(Stage):
    """A :class:`Stage` inside a Ray actor, with its own torch thread count."""

    def __init__(self, threads: int, *args, **kwargs) -> None:
        torch.set_num_threads(max(1, int(threads)))
        super().__init__(*args, **kwargs)


_REMOTE_STAGE = None


def _remote_stage_class():
    global _REMOTE_STAGE
    if _REMOTE_STAGE is None:
        import ray

        _REMOTE_STAGE = ray.remote(StageActor)
    return _REMOTE_STAGE


def ensure_ray(address: str | None = None) -> None:
    """``ray.init`` unless Ray is already up (e.g. inside a Flower simulation); ``address`` joins a cluster."""
    import ray

    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}
        if address:
            kwargs["address"] = address
        ray.init(**kwargs)


class RayStages:
    """One Ray actor per device holding its segment and optimizer (``num_cpus=actor_num_cpus``)."""

    backend = "ray"

    def __init__(
        self,
        specs: Sequence[tuple[int, nn.ModuleList, dict | None, float]],
        optimizer: OptimizerSpec,
        *,
        address: str | None = None,
        num_cpus: float = 0.0,
        threads: int = 1,
        timeout_s: float = 300.0,
        name: str = "",
    ) -> None:
        import ray

        ensure_ray(address)
        self._ray = ray
        self.timeout_s = float(timeout_s)
        self.where = f"{name}: " if name else ""
        self.device_indices = [k for k, _, _, _ in specs]
        cls = _remote_stage_class()
        self._submitted = []
        self.actors = [
            cls.options(num_cpus=num_cpus, max_restarts=0).remote(threads, k, seg, optimizer, optimizer_state=st, slowdown=slow)
            for k, seg, st, slow in specs
        ]
        # Fail here, with the device named, if an actor cannot start (no resources, import error). Starting
        # a worker process (torch + transformers imports) takes seconds, so this wait has its own limit.
        start_timeout = max(self.timeout_s, START_TIMEOUT_S)
        for s, actor in enumerate(self.actors):
            try:
                ray.get(actor.ping.remote(), timeout=start_timeout)
            except ray.exceptions.GetTimeoutError:
                self.shutdown()
                raise DeviceFailure(
                    f"{self.where}device {self.device_indices[s]}'s Ray actor did not start within {start_timeout:g}s; "
                    "check the Ray cluster has room for it (runtime.actor_num_cpus) and that the device is up"
                ) from None
            except ray.exceptions.RayActorError:
                self.shutdown()
                raise DeviceFailure(
                    f"{self.where}device {self.device_indices[s]}'s Ray actor failed to start; see the Ray worker log for the cause"
                ) from None

    def new_step(self) -> None:
        self._submitted: list[tuple[object, int]] = []

    def submit(self, stage: int, method: str, *args):
        ref = getattr(self.actors[stage], method).remote(*args)
        self._submitted.append((ref, stage))
        return ref

    def _stuck_stage(self, default: int) -> int:
        """The stage of the earliest call (in submission, hence dependency, order) still not done."""
        for ref, stage in self._submitted:
            ready, _ = self._ray.wait([ref], timeout=0)
            if not ready:
                return stage
        return default

    def resolve(self, handle, stage: int):
        ray = self._ray
        try:
            return ray.get(handle, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            stage = self._stuck_stage(stage)
            raise DeviceFailure(
                f"{self.where}device {self.device_indices[stage]} gave no answer within device_timeout_s={self.timeout_s:g}s; check that device or raise runtime.device_timeout_s"
            ) from None
        except ray.exceptions.RayActorError as err:
            raise DeviceFailure(
                f"{self.where}device {self._dead_device(err, stage)} died during the step (its Ray actor is gone); re-plan the cluster without it"
            ) from None
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, ray.exceptions.RayActorError):
                raise DeviceFailure(
                    f"{self.where}device {self._dead_device(cause, stage)} died during the step (its Ray actor is gone); re-plan the cluster without it"
                ) from None
            raise err.as_instanceof_cause() from None

    def _dead_device(self, err, stage: int) -> int:
        """The device whose actor died: by the error's actor id, else the first that does not answer."""
        actor_id = getattr(err, "actor_id", None)
        for s, actor in enumerate(self.actors):
            if actor_id is not None and actor._actor_id.hex() == actor_id:
                return self.device_indices[s]
        for s, actor in enumerate(self.actors):
            try:
                self._ray.get(actor.ping.remote(), timeout=min(5.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - any failure to answer marks the device
                return self.device_indices[s]
        return self.device_indices[stage]

    def kill(self, stage: int) -> None:
        """Kill one device's actor (fault-injection for tests and demos)."""
        self._ray.kill(self.actors[stage], no_restart=True)

    def shutdown(self) -> None:
        for actor in getattr(self, "actors", []):
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
