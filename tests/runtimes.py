"""ClusterRuntime for a test's pipeline: the ``runtime`` fields it names, the rest as a pipeline built without a
config has them (stages in this process, fp32, no actor started ahead)."""

from __future__ import annotations

import dataclasses

from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME, ClusterRuntime


def runtime(actor_threads: int | None = None, name: str = "", **spec) -> ClusterRuntime:
    return ClusterRuntime(dataclasses.replace(LOCAL_RUNTIME.spec, **spec), name=name, actor_threads=actor_threads)
