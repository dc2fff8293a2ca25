"""ClusterRuntime for a test's pipeline: the ``runtime`` fields it names, the rest as a pipeline built without a
config has them (stages in this process, fp32, no actor started ahead)."""

from __future__ import annotations

from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, RuntimeSpec


def runtime(actor_threads: int | None = None, name: str = "", **spec) -> ClusterRuntime:
    fields = {"backend": "local", "precision": "fp32", "prestart_devices": False, **spec}
    return ClusterRuntime(RuntimeSpec(**fields), name=name, actor_threads=actor_threads)
