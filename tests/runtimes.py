"""ClusterRuntime for a test's pipeline: the ``runtime`` fields it names, the rest as a pipeline built without a
config has them (stages in this process, fp32, no actor started ahead)."""

from __future__ import annotations

import dataclasses

from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME, ClusterRuntime

# the custom resources of two device boxes, as ``ray start --resources '{"edge_box_0": 1}'`` offers them on a box:
# the tests' Ray instance (conftest's ``ray_session``) has them, and test_pipeline_ray pins device actors to them
DEVICE_RESOURCES = {"edge_box_0": 1.0, "edge_box_1": 1.0}


def runtime(actor_threads: int | None = None, name: str = "", **spec) -> ClusterRuntime:
    return ClusterRuntime(dataclasses.replace(LOCAL_RUNTIME.spec, **spec), name=name, actor_threads=actor_threads)
