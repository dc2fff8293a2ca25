"""GPipe pipeline runtime: device stages (in-process or Ray actors) driven by the CU (``ClusterPipeline``)."""

from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import HeadFn, LocalHead, head_step
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.timings import StepResult, StepTimings

__all__ = ["ClusterPipeline", "HeadFn", "StepResult", "LocalHead", "head_step", "OptimizerSpec", "StepTimings"]
