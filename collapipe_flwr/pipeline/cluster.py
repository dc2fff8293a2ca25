"""The CU-side driver of one cluster: embedding on the CU, S segments on devices, m micro-batches per step.

One ``train_step`` (paper Section III.B steps 3-6, Fig. 2, Algorithm 1 lines 5-22):
1. split the batch b into m micro-batches of b_hat = b/m (eq. (5)); a batch shorter than m (a partition's last
   of an epoch) into one-sample micro-batches;
2. forward, head and backward in the runtime's ``schedule``: ``gpipe`` (``pipeline/gpipe.py``: every forward in
   the GPipe clock order, one head call on all m z^enc, every backward; a stage holds m micro-batches) or
   ``1f1b`` (``pipeline/one_f_one_b.py``: one head exchange per micro-batch, stage k holds min(m, S - k));
   either way explicit loss scaling (each micro-batch's loss SUM over the whole batch's target count), so the
   step loss and every gradient equal the plain model's mean loss;
3. every segment and the embedding take one optimizer step.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError, PartitionError
from collapipe_flwr.models.split import concat_segments, renumber_blocks, segment_bounds, validate_partition
from collapipe_flwr.pipeline.cluster_profile import measure_cluster
from collapipe_flwr.pipeline.cu_embedding import CuEmbedding
from collapipe_flwr.pipeline.device_process import DeviceProcess
from collapipe_flwr.pipeline.executors import Stages, open_stages
from collapipe_flwr.pipeline.gpipe import gpipe_step
from collapipe_flwr.pipeline.head import HeadFn, MicroHead
from collapipe_flwr.pipeline.memory import max_blocks_per_device, module_block_memory_bytes
from collapipe_flwr.pipeline.microbatch import batch_size, split_batch
from collapipe_flwr.pipeline.one_f_one_b import one_f_one_b_step
from collapipe_flwr.pipeline.optim import OptimizerSpec, scale_lr
from collapipe_flwr.pipeline.placement import segment_specs, whole_encoder_holders
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME, ClusterRuntime
from collapipe_flwr.pipeline.stage import emulation_slowdowns
from collapipe_flwr.pipeline.timings import StepResult, StepTimings
from collapipe_flwr.precision import resolve_precision
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.pipeline_model import SCHEDULES, held_samples
from collapipe_flwr.system.profile import (
    ClusterProfile,
    DeviceEmulation,
)


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
        if runtime.schedule not in SCHEDULES:
            raise ConfigError(f"pipeline.schedule={runtime.schedule!r} must be one of {', '.join(SCHEDULES)}")
        if rt.emulate and not devices:
            raise ConfigError(
                "runtime.emulate=true needs device profiles; give the network preset's devices or set emulate=false"
            )
        self.embedding = embedding
        self.optimizer_spec = optimizer
        self.embedding_optimizer = optimizer.build(embedding.parameters())
        self._embedding_base_lrs = [g["lr"] for g in self.embedding_optimizer.param_groups]
        self.devices = list(devices) if devices else None
        self._on_testbed = False  # set_testbed was called: clear_testbed has quotas and throttles to undo
        self.runtime = runtime
        self.backend = rt.backend
        self.schedule = runtime.schedule
        self.emulate = rt.emulate
        self.name = runtime.name
        self.precision = resolve_precision(rt.precision, "cpu")  # the CU's embedding runs on the CU's CPU
        self.num_blocks = len(blocks)
        self._encoder_keys = list(blocks.state_dict())
        self._template = copy.deepcopy(blocks[0]) if len(blocks) else None
        self.delta = self._check_delta(delta)
        self._bounds = segment_bounds(self.delta)
        self.moved_blocks = False  # whether the last partition change moved blocks between devices
        # C7 as the round's planner computed it (blocks device k may hold, fl/cu/planned_memory.py); None = the
        # CU's own per-block estimate (pipeline/memory.py) in check_memory
        self.planned_caps: tuple[int, ...] | None = None
        num_devices = len(self.devices) if self.devices else len(self.delta)
        self._stages: Stages = open_stages(runtime, optimizer, num_devices=num_devices, segments=len(self._bounds))
        if not self._adopt(self.delta):
            self._place(self.delta, blocks=blocks)
        if rt.prestart_devices and self.devices:
            self._stages.start_idle(range(len(self.devices)), _block_modules(self._template))

    # -- partition --------------------------------------------------------------------------------
    @property
    def S(self) -> int:
        return len(self._bounds)

    def _static_caps(self) -> list[int] | None:
        if not self.devices or self._template is None:
            return None
        per_block = module_block_memory_bytes(self._template, 0, 0, self.optimizer_spec.name)
        return max_blocks_per_device([d.memory_bytes for d in self.devices], per_block)

    def _check_delta(self, delta) -> tuple[int, ...]:
        K = len(self.devices) if self.devices is not None else None
        return validate_partition(delta, self.num_blocks, self._static_caps(), num_devices=K)

    def _slowdowns(self, bounds: Sequence[tuple[int, int, int]]) -> dict[int, float]:
        if not self.emulate:
            return {}
        if self.devices is None:  # unreachable: __init__ refuses emulate without device profiles
            raise ConfigError(f"{self.name}: runtime.emulate=true needs device profiles")
        return emulation_slowdowns(self.devices, [k for k, _, _ in bounds])

    def _block(self) -> nn.Module:
        """One TEB of the encoder: the template of new segments and of memory estimates."""
        if self._template is None:  # unreachable: __init__'s delta check refuses an encoder without blocks
            raise PartitionError(f"{self.name}: the encoder has L=0 blocks; build a model with at least one block")
        return self._template

    def _holders(self) -> dict[int, tuple[int, int]]:
        return whole_encoder_holders(self._stages.layout(), self.num_blocks)

    def _adopt(self, delta) -> bool:
        """Make the live devices hold ``delta``'s segments: as they are when they already do (e.g. a CU
        process that finds the actors another process of the same CU left), else by moving their blocks
        with weights and optimizer state. False when the live devices do not hold the whole encoder."""
        held = self._holders()
        if not held:
            return False
        bounds = segment_bounds(delta)
        if len(held) == len(bounds) and all(held.get(k) == (a, b) for k, a, b in bounds):
            slowdown = self._slowdowns(bounds)
            self._stages.place([(k, None, None, slowdown.get(k, 1.0), a) for k, a, _ in bounds], free_others=False)
            self.delta, self._bounds = tuple(delta), bounds
            self.moved_blocks = False
        else:
            weights, state = self._gather_from(held)
            self._place(delta, weights=weights, optimizer_state=state)
            self.moved_blocks = True
        return True

    def _gather_from(self, held: dict[int, tuple[int, int]]) -> tuple[dict, dict]:
        """Every block's weights and optimizer state from the devices in ``held``, in the encoder's numbering."""
        weights = {}
        for k, (a, _) in held.items():
            weights.update(renumber_blocks(self._stages.call_device(k, "get_weights"), a))
        return weights, self._optimizer_state_from(held)

    def _optimizer_state_from(self, held: dict[int, tuple[int, int]]) -> dict:
        """Every block's optimizer state from the devices in ``held``, in the encoder's numbering."""
        state: dict = {}
        for k, (a, _) in held.items():
            state.update(renumber_blocks(self._stages.call_device(k, "get_optimizer_state"), a))
        return state

    def _place(
        self,
        delta,
        weights: dict | None = None,
        optimizer_state: dict | None = None,
        blocks: nn.ModuleList | None = None,
    ) -> None:
        self.delta = self._check_delta(delta)
        self._bounds = segment_bounds(self.delta)
        slowdown = self._slowdowns(self._bounds)
        template = None if blocks is not None else self._block()
        specs = segment_specs(self._bounds, slowdown, template, blocks, weights, optimizer_state)
        self._stages.place(specs)

    def repartition(self, delta: Sequence[int]) -> None:
        """Move to a new delta, carrying every block's weights and optimizer state between the live devices
        (no device process is restarted; a bad delta changes nothing). The live layout is read first, so a
        session whose devices another CU process re-partitioned since still lands on ``delta``."""
        delta = self._check_delta(delta)
        if not self._adopt(delta):
            raise PartitionError(f"{self.name}: the devices no longer hold the whole encoder; rebuild the pipeline")

    def recover(self, delta: Sequence[int], encoder_state: dict[str, torch.Tensor], lost: Sequence[int]) -> None:
        """After device failures: forget the ``lost`` devices and place ``delta`` (0 on every lost device) on
        the others from ``encoder_state`` (the round's starting theta^enc), with fresh optimizer state."""
        delta = tuple(int(x) for x in delta)
        if any(delta[k] for k in lost):
            raise PartitionError(f"{self.name}: the re-plan {list(delta)} puts blocks on lost device(s) {list(lost)}")
        for k in lost:
            self._stages.forget(k)
        self._place(delta, weights=encoder_state)
        self.moved_blocks = True
        self.reset_optimizers()

    def reset_optimizers(self) -> None:
        """Fresh optimizer state for the embedding and every segment (``federation.optimizer_state: reset``)."""
        self.embedding_optimizer = self.optimizer_spec.build(self.embedding.parameters())
        self._embedding_base_lrs = [g["lr"] for g in self.embedding_optimizer.param_groups]
        for k, _, _ in self._bounds:
            self._stages.call_device(k, "reset_optimizer")

    def processes(self) -> dict[int, DeviceProcess]:
        """{device k: the OS process holding it, and its network namespace} (the CU's own on the local backend)."""
        return self._stages.processes()

    # -- the testbed and measured profiles (system/profile.py) -----------------------------------------
    def live_devices(self) -> list[int]:
        """The devices k whose actors are alive (holding blocks or idle), in index order."""
        return sorted(self._stages.layout())

    def set_testbed(self, emulation: DeviceEmulation, cgroup_prefix: str) -> dict[int, float]:
        """Put every live device under the testbed's CPU quota, link throttle and memory limit gamma_k^max of
        ``emulation`` (one entry per device k); returns {k: cores its cgroup grants, read back}. A device the OS
        cannot throttle or limit raises TestbedError (never a silent unthrottled or unlimited run)."""
        self._on_testbed = True
        memory = emulation.memory_bytes or (0.0,) * len(emulation.cpu_cores)
        return {
            k: float(
                self._stages.call_device(
                    k,
                    "set_testbed",
                    emulation.cpu_cores[k],
                    emulation.d2d_bytes_per_s[k],
                    emulation.d2d_latency_s[k],
                    f"{cgroup_prefix}d{k}",
                    memory[k],
                )
            )
            for k in self.live_devices()
        }

    def clear_testbed(self) -> None:
        """Back to unthrottled devices; nothing to do (no call to the devices) when this pipeline never set a
        testbed, so a run without one pays nothing per round."""
        if not self._on_testbed:
            return
        for k in self.live_devices():
            self._stages.call_device(k, "clear_testbed")
        self._on_testbed = False

    def measure(self, batch_size_b: int, seq_len: int, width: int, repeats: int = 3) -> ClusterProfile:
        """Time every live device's TEB and the link out of it (``pipeline/cluster_profile.py``)."""
        K = len(self.devices) if self.devices else len(self.delta)
        return measure_cluster(self._stages, K, self._block(), batch_size_b, seq_len, width, repeats)

    def check_memory(self, batch_size_b: int, seq_len: int, m: int = 1) -> None:
        """Constraint C7 with activations: delta_k blocks at the samples stage k holds at once must fit
        gamma_k^max (the whole batch under GPipe, min(b, b_hat min(m, S - k)) under 1F1B)."""
        if not self.devices:
            return
        if self.planned_caps is not None:
            note = "the planner's C7 caps (gamma_k^max / gamma_0 of the workload it planned with)"
            validate_partition(self.delta, self.num_blocks, self.planned_caps, memory_note=note)
            return
        mem, name = [d.memory_bytes for d in self.devices], self.optimizer_spec.name
        per_block = module_block_memory_bytes(self._block(), batch_size_b, seq_len, name)
        caps = max_blocks_per_device(mem, per_block)  # GPipe: the whole batch on every device
        for s, (k, _, _) in enumerate(self._bounds if self.schedule != "gpipe" else ()):
            held = held_samples(self.schedule, batch_size_b, m, self.S, s)
            per_block = module_block_memory_bytes(self._block(), held, seq_len, name)
            caps[k] = max_blocks_per_device([mem[k]], per_block)[0]
        note = f"a batch of {batch_size_b}x{seq_len} tokens, {self.schedule} (~{per_block / 2**20:.1f} MiB per block)"
        validate_partition(self.delta, self.num_blocks, caps, memory_note=note)

    # -- one step ---------------------------------------------------------------------------------
    def train_step(
        self,
        batch: dict[str, torch.Tensor],
        m: int,
        head: HeadFn | MicroHead,
        lr_factor: float = 1.0,
        step_seed: int | None = None,
    ) -> StepResult:
        """One step in the runtime's schedule (module docstring); ``lr_factor`` scales the base lr of every segment,
        the embedding and the head for this step (the run's learning-rate clock, ``tasks.lr_schedule.LrClock``);
        ``step_seed`` (``runtime.seeded_dropout``) fixes the dropout masks of the embedding and of every block, the
        same whichever device holds it (``pipeline/dropout_seed.py``).
        Under 1F1B ``head`` must be a :class:`~collapipe_flwr.pipeline.head.MicroHead` (m exchanges a step)."""
        t0 = time.perf_counter()
        b = batch_size(batch)
        micro = split_batch(batch, m)
        m = len(micro)  # min(m, b): a short batch (an epoch's last) runs in fewer micro-batches
        self.check_memory(b, int(batch["input_ids"].shape[1]), m)
        self._begin_step(step_seed)
        cu = CuEmbedding(self.embedding, self.precision, step_seed)
        updates = None  # GPipe submits each stage's update behind its backward (pipeline/gpipe.py)
        if self.schedule == "1f1b":
            loss, phases = one_f_one_b_step(self._stages, self.S, cu, micro, head, lr_factor)  # type: ignore[arg-type]
        else:
            loss, phases, updates = gpipe_step(self._stages, self.S, cu, micro, head, lr_factor)  # type: ignore[arg-type]
        t_bwd = time.perf_counter()
        device_compute = self._update(lr_factor, updates)
        t_end = time.perf_counter()
        timings = StepTimings(
            embed=cu.seconds,
            forward=t_bwd - t0 - phases["head"] - phases["backward"],
            head=phases["head"],
            backward=phases["backward"],
            update=t_end - t_bwd,
            total=t_end - t0,
            device_compute={int(k): float(c) for (k, _, _), c in zip(self._bounds, device_compute)},
        )
        count = int((batch["labels"] != -100).sum()) if "labels" in batch else b
        return StepResult(loss=float(loss), count=count, timings=timings)

    def _begin_step(self, step_seed: int | None) -> None:
        self.embedding.train()
        self.embedding_optimizer.zero_grad(set_to_none=True)
        self._gather("begin_step", step_seed)

    def _update(self, lr_factor: float, submitted: list | None = None) -> list[float]:
        """Every segment and the embedding take one optimizer step (the segments' already ``submitted``, or now);
        returns each stage's compute seconds."""
        steps = submitted
        if steps is None:
            steps = [self._stages.submit(s, "step", float(lr_factor)) for s in range(self.S)]
        scale_lr(self.embedding_optimizer, self._embedding_base_lrs, lr_factor)
        self.embedding_optimizer.step()
        self.embedding_optimizer.zero_grad(set_to_none=True)
        return [self._stages.get(h, s) for s, h in enumerate(steps)]

    # -- state ------------------------------------------------------------------------------------
    def _gather(self, method: str, *args) -> list:
        self._stages.new_step()
        handles = [self._stages.submit(s, method, *args) for s in range(self.S)]
        return [self._stages.get(h, s) for s, h in enumerate(handles)]

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """theta^enc = theta^1 (+) ... (+) theta^S (eq. (4)), names ``"{l}.{param}"``."""
        return concat_segments(self._gather("get_weights"), self.delta)

    def load_encoder_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load theta^enc (names ``"{l}.{param}"``) into the segments, each device its slice."""
        missing = [k for k in self._encoder_keys if k not in state]
        extra = [k for k in state if k not in set(self._encoder_keys)]
        if missing or extra:
            what = f"lacks {missing[0]}" if missing else f"has unexpected {extra[0]}"
            raise ConfigError(
                f"encoder state dict {what} ({len(missing)} missing, {len(extra)} unexpected); it must come from an "
                f"encoder with the same model config (L={self.num_blocks})"
            )
        self._stages.new_step()
        handles = []
        for s, (_, a, b) in enumerate(self._bounds):
            handles.append(self._stages.submit(s, "set_weights", renumber_blocks(state, -a, range(a, b))))
        for s, h in enumerate(handles):
            self._stages.get(h, s)

    def encoder_optimizer_state(self) -> dict[str, dict]:
        """Every block's optimizer state, names ``"{l}.{param}"`` (the whole encoder's numbering)."""
        held = self._holders()
        return self._optimizer_state_from(held) if held else {}

    def load_encoder_optimizer_state(self, state: dict[str, dict]) -> None:
        """Put optimizer state (names ``"{l}.{param}"``) back into the devices holding those blocks."""
        for k, a, b in self._bounds:
            self._stages.call_device(k, "load_optimizer_state", renumber_blocks(state, -a, range(a, b)))

    def embedding_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.embedding.state_dict().items()}

    def load_embedding_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        try:
            self.embedding.load_state_dict(state, strict=True)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            raise ConfigError(
                f"embedding state dict does not fit the CU's embedding ({first}); it must come from the same model "
                "config"
            ) from None

    def traces(self) -> list[list[tuple[str, int, float, float]]]:
        """Per stage, the last step's (F|B, micro-batch, wall start, wall end) calls (schedule plots)."""
        return self._gather("trace")

    def memory_report(self) -> list[dict]:
        """Per device used: param, optimizer-state and peak activation bytes (and their sum)."""
        return self._gather("memory_report")

    def shutdown(self) -> None:
        if self._stages is not None:
            self._stages.shutdown()
            self._stages = None  # type: ignore[assignment]  # shut down: every later call fails

    def __enter__(self) -> ClusterPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
