"""The CU-side driver of one cluster (:class:`ClusterPipeline`): the embedding on the CU, S segments on devices,
m micro-batches per step. A façade over its three parts:

- the placement (``pipeline/placement.py``, :class:`~collapipe_flwr.pipeline.placement.ClusterPlacement`,
  ``pipeline.placement``): which device holds which blocks, repartitions and recoveries moving blocks and optimizer
  state between devices, C7 (callers read and set its ``planned_caps``, ``moved_blocks`` and the encoder's
  optimizer state there);
- the testbed and measured profiles (``pipeline/cluster_profile.py``,
  :class:`~collapipe_flwr.pipeline.cluster_profile.ClusterTestbed`, ``pipeline.testbed``: callers set and clear the
  devices' quotas, throttles and limits there);
- the training step (``pipeline/cluster_step.py``, :class:`~collapipe_flwr.pipeline.cluster_step.ClusterStep`:
  micro-batches, the GPipe or 1F1B schedule, the optimizer steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError, DeviceFailure, StateMismatchError
from collapipe_flwr.models.split import concat_segments, renumber_blocks
from collapipe_flwr.pipeline.cluster_profile import ClusterTestbed
from collapipe_flwr.pipeline.cluster_step import ClusterStep, gather
from collapipe_flwr.pipeline.executors import Stages
from collapipe_flwr.pipeline.head import HeadFn, MicroHead
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.placement import ClusterPlacement
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME, ClusterRuntime
from collapipe_flwr.pipeline.timings import StepResult
from collapipe_flwr.precision import resolve_precision
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.profile import ClusterProfile


def _block_modules(block: nn.Module | None) -> list[str]:
    """The modules that define ``block``'s classes (its own and its submodules'): what a device process imports
    when it unpickles its first segment of such blocks (``Stage.warm_up`` does it ahead)."""
    return sorted({type(m).__module__ for m in block.modules()}) if block is not None else []


class ClusterPipeline:
    """A pipeline over device stages (see module docstring); signature as in docs/contracts.md.

    ``runtime`` (:class:`~collapipe_flwr.pipeline.runtime_spec.ClusterRuntime`, default: stages in this process,
    fp32) says where and how the stages run: the backend, ``emulate`` (slow each device in proportion to its
    profile), ``device_timeout_s`` (every wait on a device), ``precision``, ``device``, ``prestart_devices`` (start
    every device's actor now, so a later plan that uses it pays no start-up), ``pin_threads`` and the Ray options,
    with the cluster's ``name`` (prefix of error messages), ``actor_prefix`` (named, detached actors that later
    rounds and other processes of the CU find again), ``actor_threads`` and ``schedule`` (gpipe | 1f1b).
    Everything backend-specific goes through the :class:`~collapipe_flwr.pipeline.executors.interface.Stages` executor.

    ``blocks`` are copied into the stages (the caller's modules are not trained); the ``embedding`` is
    the CU's own module and is trained in place. Read the encoder back with :meth:`encoder_state_dict`.

    Callers hold the seams they use, no method hands on to them: :attr:`placement` (``S``, ``delta``,
    ``repartition``: pipeline/placement.py), :attr:`stages` (the executor: ``processes()``, the device handles),
    :attr:`step` (one step and the embedding's optimizer: pipeline/cluster_step.py) and :attr:`testbed` (quotas,
    throttles, measured profiles). The methods here each join two of them (``recover``, ``train_step``, ...).
    """

    def __init__(
        self,
        embedding: nn.Module,
        blocks: nn.ModuleList,
        delta: Sequence[int],
        optimizer: OptimizerSpec,
        devices: Sequence[DeviceProfile] | None = None,
        runtime: ClusterRuntime = LOCAL_RUNTIME,
    ) -> None:
        rt = runtime.spec
        if rt.emulate and not devices:
            raise ConfigError(
                "runtime.emulate=true needs device profiles; give the network preset's devices or set emulate=false"
            )
        self.embedding = embedding
        self.optimizer_spec = optimizer
        self.precision = resolve_precision(rt.precision, "cpu")  # the CU's embedding runs on the CU's CPU
        self.step = ClusterStep(embedding, optimizer, self.precision, runtime.schedule)
        self.devices = list(devices) if devices else None
        self.runtime = runtime
        self.backend = rt.backend
        self.schedule = runtime.schedule
        self.emulate = rt.emulate
        self.name = runtime.name
        self.num_blocks = len(blocks)
        self._encoder_keys = list(blocks.state_dict())
        self.placement = ClusterPlacement(blocks, delta, optimizer, self.devices, runtime)
        self.stages: Stages = self.placement.stages
        self.testbed = ClusterTestbed(self.stages)
        if rt.prestart_devices and self.devices:
            self.stages.start_idle(range(len(self.devices)), _block_modules(self.placement.template))

    # -- partition (pipeline/placement.py: S, delta, repartition) ---------------------------------------
    def recover(self, delta: Sequence[int], encoder_state: dict[str, torch.Tensor], lost: Sequence[int]) -> None:
        """After device failures: forget the ``lost`` devices and place ``delta`` (0 on every lost device) on
        the others from ``encoder_state`` (the round's starting theta^enc), with fresh optimizer state."""
        self.placement.recover(delta, encoder_state, lost)
        self.reset_optimizers()

    def reset_optimizers(self) -> None:
        """Fresh optimizer state for the embedding and every segment (``federation.optimizer_state: reset``)."""
        self.step.reset_optimizer()
        self.placement.reset_optimizers()

    def take_idle_losses(self) -> list[DeviceFailure]:
        """The devices found dead while the plan left them idle, since the last take (``stages.processes()``): they took
        no part in the steps, so the round stands; they join :attr:`lost_devices`."""
        losses = self.stages.take_idle_losses()
        self.placement.lost.update(int(f.device) for f in losses if f.device is not None)
        return losses

    @property
    def lost_devices(self) -> tuple[int, ...]:
        """The devices this pipeline lost in the run (re-planned around, or found dead while idle): never given
        blocks again (the CU re-plans a later round that gives them some, ``fl/cu/device_loss.py``)."""
        return tuple(sorted(self.placement.lost))

    # -- the testbed and measured profiles (pipeline/cluster_profile.py; quotas and throttles: ``testbed``) ------
    def measure(self, batch_size_b: int, seq_len: int, width: int, repeats: int = 3) -> ClusterProfile:
        """Time every live device's TEB and the link out of it (``pipeline/cluster_profile.py``)."""
        K = len(self.devices) if self.devices else len(self.placement.delta)
        return self.testbed.measure(K, self.placement.block(), batch_size_b, seq_len, width, repeats)

    # -- one step (pipeline/cluster_step.py) --------------------------------------------------------------
    def train_step(
        self,
        batch: dict[str, torch.Tensor],
        m: int,
        head: HeadFn | MicroHead,
        lr_factor: float = 1.0,
        step_seed: int | None = None,
    ) -> StepResult:
        """One step in the runtime's schedule (``pipeline/cluster_step.py``); ``lr_factor`` scales the base lr of
        every segment, the embedding and the head for this step (the run's learning-rate clock,
        ``tasks.lr_schedule.LrClock``); ``step_seed`` (``runtime.seeded_dropout``) fixes the dropout masks of the
        embedding and of every block, the same whichever device holds it (``pipeline/dropout_seed.py``).
        Under 1F1B ``head`` must be a :class:`~collapipe_flwr.pipeline.head.MicroHead` (m exchanges a step)."""
        return self.step.train_step(self.placement, batch, m, head, lr_factor, step_seed)

    # -- state ------------------------------------------------------------------------------------
    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """theta^enc = theta^1 (+) ... (+) theta^S (eq. (4)), names ``"{l}.{param}"``."""
        weights = gather(self.stages, self.placement.S, self.stages.submit_get_weights)
        return concat_segments(weights, self.placement.delta)

    def load_encoder_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load theta^enc (names ``"{l}.{param}"``) into the segments, each device its slice."""
        missing = [k for k in self._encoder_keys if k not in state]
        extra = [k for k in state if k not in set(self._encoder_keys)]
        if missing or extra:
            what = f"lacks {missing[0]}" if missing else f"has unexpected {extra[0]}"
            raise StateMismatchError(
                f"encoder state dict {what} ({len(missing)} missing, {len(extra)} unexpected); it must come from an "
                f"encoder with the same model config (L={self.num_blocks})"
            )
        bounds, stages = self.placement.bounds, self.stages

        def submit(s: int):
            _, a, b = bounds[s]
            return stages.submit_set_weights(s, renumber_blocks(state, -a, range(a, b)))

        gather(stages, self.placement.S, submit)

    def embedding_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.embedding.state_dict().items()}

    def load_embedding_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        try:
            self.embedding.load_state_dict(state, strict=True)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            raise StateMismatchError(
                f"embedding state dict does not fit the CU's embedding ({first}); it must come from the same model "
                "config"
            ) from None

    def traces(self) -> list[list[tuple[str, int, float, float]]]:
        """Per stage, the last step's (F|B, micro-batch, wall start, wall end) calls (schedule plots)."""
        return gather(self.stages, self.placement.S, self.stages.submit_trace)

    def memory_report(self) -> list[dict]:
        """Per device used: param, optimizer-state and peak activation bytes (and their sum)."""
        return gather(self.stages, self.placement.S, self.stages.submit_memory_report)

    def shutdown(self) -> None:
        if self.stages is not None:
            self.stages.shutdown()
            self.stages = None  # type: ignore[assignment]  # shut down: every later call fails

    def __enter__(self) -> ClusterPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
