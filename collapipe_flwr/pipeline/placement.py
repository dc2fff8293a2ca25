"""Which device holds which TEBs: the segments a partition delta puts on each device, whether the live devices
already hold the whole encoder (pure functions over the devices' layouts), and :class:`ClusterPlacement`, which
applies them to one cluster's stages: it opens them, places delta's segments, moves blocks with their weights and
optimizer state between the live devices when delta changes, and checks that delta fits the devices (C7)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError, PartitionError
from collapipe_flwr.models.split import renumber_blocks, segment_bounds, validate_partition
from collapipe_flwr.pipeline.executors import Stages, StageSpec, open_stages
from collapipe_flwr.pipeline.memory import max_blocks_per_device, module_block_memory_bytes, module_input_bytes
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime
from collapipe_flwr.pipeline.stage import emulation_slowdowns
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.pipeline_model import Checkpoint, Schedule, held_activation_samples


def whole_encoder_holders(layout: Mapping[int, tuple[int, int]], num_blocks: int) -> dict[int, tuple[int, int]]:
    """{device k: (a, b)} of the devices in ``layout`` that hold blocks a..b-1, when together they hold the whole
    encoder of L = ``num_blocks`` blocks exactly once; else {}."""
    held = {k: ab for k, ab in layout.items() if ab[1] > ab[0]}
    a0 = 0
    for a, b in sorted(held.values()):
        if a != a0:
            return {}
        a0 = b
    return held if held and a0 == num_blocks else {}


def segment_specs(
    bounds: Sequence[tuple[int, int, int]],
    slowdown: Mapping[int, float],
    template: nn.Module | None,
    blocks: nn.ModuleList | None = None,
    weights: dict | None = None,
    optimizer_state: dict | None = None,
) -> list[StageSpec]:
    """One StageSpec per segment (k, a, b) of ``bounds``: a copy of ``blocks[a:b]``, or ``template`` copies loaded
    with ``weights`` (names ``"{l}.{param}"`` of the whole encoder), with that segment's optimizer state."""
    specs: list[StageSpec] = []
    for k, a, b in bounds:
        if blocks is not None:
            segment = copy.deepcopy(nn.ModuleList(blocks[a:b]))
        elif template is None:
            raise ValueError("segment_specs needs the encoder's blocks or a template block")
        else:
            segment = nn.ModuleList(copy.deepcopy(template) for _ in range(b - a))
            segment.load_state_dict(renumber_blocks(weights or {}, -a, range(a, b)), strict=True)
        state = renumber_blocks(optimizer_state or {}, -a, range(a, b))
        specs.append(StageSpec(k, segment, state, slowdown=slowdown.get(k, 1.0), offset=a))
    return specs


class ClusterPlacement:
    """The encoder's L blocks on one cluster's devices: ``delta`` (blocks per device k), its segments
    ``bounds`` [(k, first block, end block)] in pipeline order (stage s = ``bounds[s]``), and the
    :class:`~collapipe_flwr.pipeline.executors.interface.Stages` that hold them (opened here, on
    ``runtime.spec.backend``). ``blocks`` are copied into the stages; devices that already hold the whole encoder
    (named actors another CU process left) are adopted as they are, or their blocks moved to ``delta``."""

    def __init__(
        self,
        blocks: nn.ModuleList,
        delta: Sequence[int],
        optimizer: OptimizerSpec,
        devices: list[DeviceProfile] | None,
        runtime: ClusterRuntime,
    ) -> None:
        self.optimizer_spec = optimizer
        self.devices = devices
        self.name = runtime.name
        self.emulate = runtime.spec.emulate
        self.schedule = runtime.schedule
        self.checkpoint = runtime.checkpoint
        self.num_blocks = len(blocks)
        self.template = copy.deepcopy(blocks[0]) if len(blocks) else None
        self.delta = self._check_delta(delta)
        self.bounds = segment_bounds(self.delta)
        self.moved_blocks = False  # whether the last partition change moved blocks between devices
        # C7 as the round's planner computed it (blocks device k may hold, fl/cu/planned_memory.py); None = the
        # CU's own per-block estimate (pipeline/memory.py) in check_memory
        self.planned_caps: tuple[int, ...] | None = None
        self.lost: set[int] = set()  # devices lost in this run (failed, or found dead while idle): never used again
        num_devices = len(devices) if devices else len(self.delta)
        self.stages: Stages = open_stages(runtime, optimizer, num_devices=num_devices, segments=len(self.bounds))
        if not self._adopt(self.delta):
            self._place(self.delta, blocks=blocks)

    @property
    def S(self) -> int:
        return len(self.bounds)

    def block(self) -> nn.Module:
        """One TEB of the encoder: the template of new segments and of memory estimates."""
        if self.template is None:  # unreachable: __init__'s delta check refuses an encoder without blocks
            raise PartitionError(f"{self.name}: the encoder has L=0 blocks; build a model with at least one block")
        return self.template

    # -- the partition ----------------------------------------------------------------------------------
    def _static_caps(self) -> list[int] | None:
        if not self.devices or self.template is None:
            return None
        per_block = module_block_memory_bytes(self.template, 0, 0, self.optimizer_spec.name)
        return max_blocks_per_device([d.memory_bytes for d in self.devices], per_block)

    def _check_delta(self, delta) -> tuple[int, ...]:
        K = len(self.devices) if self.devices is not None else None
        return validate_partition(delta, self.num_blocks, self._static_caps(), num_devices=K)

    def _slowdowns(self, bounds: Sequence[tuple[int, int, int]]) -> dict[int, float]:
        if not self.emulate:
            return {}
        if self.devices is None:  # unreachable: ClusterPipeline refuses emulate without device profiles
            raise ConfigError(f"{self.name}: runtime.emulate=true needs device profiles")
        return emulation_slowdowns(self.devices, [k for k, _, _ in bounds])

    def check_memory(self, batch_size_b: int, seq_len: int, m: int = 1) -> None:
        """Constraint C7 with activations: delta_k blocks at the samples stage k holds at once must fit
        gamma_k^max (the whole batch under GPipe, min(b, b_hat min(m, S - k)) under 1F1B); with
        ``pipeline.checkpoint`` one micro-batch in full plus the segment inputs of the others
        (``system.pipeline_model.held_activation_samples``, ``memory.segment_memory_bytes``)."""
        if not self.devices:
            return
        if self.planned_caps is not None:
            note = "the planner's C7 caps (gamma_k^max / gamma_0 of the workload it planned with)"
            validate_partition(self.delta, self.num_blocks, self.planned_caps, memory_note=note)
            return
        mem, name = [d.memory_bytes for d in self.devices], self.optimizer_spec.name
        per_block = module_block_memory_bytes(self.block(), batch_size_b, seq_len, name)
        caps = max_blocks_per_device(mem, per_block)  # GPipe: the whole batch on every device
        staged = self.schedule is not Schedule.GPIPE or self.checkpoint is not Checkpoint.NEVER
        for s, (k, _, _) in enumerate(self.bounds if staged else ()):
            full, inputs = held_activation_samples(self.schedule, self.checkpoint, batch_size_b, m, self.S, s)
            per_block = module_block_memory_bytes(self.block(), full, seq_len, name)
            fixed = module_input_bytes(self.block(), inputs, seq_len)
            caps[k] = max_blocks_per_device([mem[k]], per_block, fixed)[0]
        how = (
            f"{self.schedule}, checkpoint {self.checkpoint}"
            if self.checkpoint is not Checkpoint.NEVER
            else self.schedule
        )
        note = f"a batch of {batch_size_b}x{seq_len} tokens, {how} (~{per_block / 2**20:.1f} MiB per block)"
        validate_partition(self.delta, self.num_blocks, caps, memory_note=note)

    # -- placing and moving blocks --------------------------------------------------------------------------
    def _holders(self) -> dict[int, tuple[int, int]]:
        return whole_encoder_holders(self.stages.layout(), self.num_blocks)

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
            held_specs = [StageSpec(k, slowdown=slowdown.get(k, 1.0), offset=a) for k, a, _ in bounds]
            self.stages.place(held_specs, free_others=False)
            self.delta, self.bounds = tuple(delta), bounds
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
            weights.update(renumber_blocks(self.stages.get_weights(k), a))
        return weights, self._optimizer_state_from(held)

    def _optimizer_state_from(self, held: dict[int, tuple[int, int]]) -> dict:
        """Every block's optimizer state from the devices in ``held``, in the encoder's numbering."""
        state: dict = {}
        for k, (a, _) in held.items():
            state.update(renumber_blocks(self.stages.get_optimizer_state(k), a))
        return state

    def _place(
        self,
        delta,
        weights: dict | None = None,
        optimizer_state: dict | None = None,
        blocks: nn.ModuleList | None = None,
    ) -> None:
        self.delta = self._check_delta(delta)
        self.bounds = segment_bounds(self.delta)
        slowdown = self._slowdowns(self.bounds)
        template = None if blocks is not None else self.block()
        specs = segment_specs(self.bounds, slowdown, template, blocks, weights, optimizer_state)
        self.stages.place(specs)

    def repartition(self, delta: Sequence[int]) -> None:
        """Move to a new delta, carrying every block's weights and optimizer state between the live devices
        (no device process is restarted; a bad delta changes nothing). The live layout is read first, so a
        session whose devices another CU process re-partitioned since still lands on ``delta``."""
        delta = self._check_delta(delta)
        if not self._adopt(delta):
            raise PartitionError(f"{self.name}: the devices no longer hold the whole encoder; rebuild the pipeline")

    def recover(self, delta: Sequence[int], encoder_state: dict[str, torch.Tensor], lost: Sequence[int]) -> None:
        """After device failures: forget the ``lost`` devices and place ``delta`` (0 on every lost device) on
        the others from ``encoder_state`` (the round's starting theta^enc); their optimizer state is the caller's
        to reset."""
        delta = tuple(int(x) for x in delta)
        if any(delta[k] for k in lost):
            raise PartitionError(f"{self.name}: the re-plan {list(delta)} puts blocks on lost device(s) {list(lost)}")
        for k in lost:
            self.stages.forget(k)
        self.lost.update(int(k) for k in lost)
        self._place(delta, weights=encoder_state)
        self.moved_blocks = True

    # -- optimizer state ------------------------------------------------------------------------------------
    def reset_optimizers(self) -> None:
        """Fresh optimizer state on every device holding a segment."""
        for k, _, _ in self.bounds:
            self.stages.reset_optimizer(k)

    def encoder_optimizer_state(self) -> dict[str, dict]:
        """Every block's optimizer state, names ``"{l}.{param}"`` (the whole encoder's numbering)."""
        held = self._holders()
        return self._optimizer_state_from(held) if held else {}

    def load_encoder_optimizer_state(self, state: dict[str, dict]) -> None:
        """Put optimizer state (names ``"{l}.{param}"``) back into the devices holding those blocks."""
        for k, a, b in self.bounds:
            self.stages.load_optimizer_state(k, renumber_blocks(state, -a, range(a, b)))
