"""What one round asks of the devices and the uplink, counted on the real encoder blocks.

``measure_workload(blocks, hidden, attention_mask)`` runs one forward and one backward of every TEB
under ``torch.utils.flop_counter.FlopCounterMode`` and records, per block and per sample,
o_l (forward FLOPs) and o'_l (backward FLOPs, gradients of both the input and the weights), the bytes
autograd saves for the backward (what GPipe keeps alive per sample), the parameter bytes, and the size
z^s of the activation crossing each block boundary (g^{s+1}, its gradient, has the same size).
FlopCounterMode counts matrix products and attention (2 FLOPs per multiply-add); element-wise work
(LayerNorm, softmax, GELU) is left out, as in the usual 6 * params * tokens accounting. PyTorch's
registry misses the CPU kernels of scaled-dot-product attention, so they are added here with PyTorch's
own sdpa formulas (forward 4 B h T_q T_k d; backward as flash attention, with the score recompute).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice
from collapipe_flwr.system.pipeline_model import Checkpoint, Schedule, held_activation_samples

T = TypeVar("T")


@dataclass(frozen=True)
class Workload:
    """Per-sample, per-block costs of the encoder, plus the batch and upload sizes.

    forward_flops[l] = o_l, backward_flops[l] = o'_l (FLOPs per sample of block l).
    boundary_bytes[s] = bytes per sample of the activation entering block s (s = 0..L; s = L is z_enc).
    param_bytes[l]: parameter bytes of block l.  saved_bytes[l]: activation bytes block l keeps per sample.
    batch_size: b.  steps_per_round: local optimizer steps per round (each moves z_enc up once).
    optimizer_slots: optimizer state tensors per parameter (Adam: 2).
    extra_upload_bytes: what the CU uploads besides the encoder (the embedding table), once per round.
    head_bytes: parameter bytes of the server-side head (decoder / task head); only a method that trains the
    head on the devices and aggregates it (vanilla_fl) uploads it (dssra/methods.py).
    trainable_bytes[l]: bytes of block l's TRAINABLE parameters when only some train (LoRA: the adapters
    theta_LoRA); () = every parameter trains. They, not param_bytes, are what the CU uploads (eq. 11, the bits
    of C9 / eq. 26) and what takes gradients and optimizer slots in gamma_0 (C7); the frozen base weights
    still occupy param_bytes of memory.
    schedule: the stage order (``pipeline.schedule``: gpipe | 1f1b), which sets C7's activation term
    (:meth:`block_memory_bytes`); checkpoint: ``pipeline.checkpoint`` (never | except_last | always), whose
    re-materialization holds one micro-batch's activations in full and only the segment inputs z^s of the others
    (:meth:`stage_memory_bytes`).
    memory_scale: multiplies gamma_0 (both its static and activation terms): 1 = as counted on the blocks; the
    planner's correction from the devices' measured peaks (``system.profile: measured``, fl/server/memory_model.py).
    """

    forward_flops: tuple[float, ...]
    backward_flops: tuple[float, ...]
    boundary_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    batch_size: int
    steps_per_round: int = 1
    optimizer_slots: int = 2
    extra_upload_bytes: float = 0.0
    head_bytes: float = 0.0
    trainable_bytes: tuple[float, ...] = ()
    schedule: Schedule = Schedule.GPIPE
    memory_scale: float = 1.0
    checkpoint: Checkpoint = Checkpoint.NEVER

    def __post_init__(self) -> None:
        if not (self.memory_scale > 0 and self.memory_scale < float("inf")):
            raise ConfigError(f"workload memory_scale={self.memory_scale!r} must be a finite number > 0")
        object.__setattr__(self, "schedule", choice("workload schedule", self.schedule, Schedule))
        object.__setattr__(self, "checkpoint", choice("workload checkpoint", self.checkpoint, Checkpoint))
        L = len(self.forward_flops)
        if L < 1 or not (len(self.backward_flops) == len(self.param_bytes) == len(self.saved_bytes) == L):
            raise ConfigError("workload needs the same number L >= 1 of forward, backward, parameter and saved sizes")
        if len(self.boundary_bytes) != L + 1:
            raise ConfigError(f"workload.boundary_bytes needs L + 1 = {L + 1} entries, got {len(self.boundary_bytes)}")
        if self.batch_size < 1 or self.steps_per_round < 1:
            raise ConfigError("workload batch_size and steps_per_round must be >= 1")
        if not self.head_bytes >= 0:
            raise ConfigError(f"workload head_bytes={self.head_bytes!r} must be >= 0")
        if self.trainable_bytes and len(self.trainable_bytes) != L:
            raise ConfigError(
                f"workload.trainable_bytes needs L = {L} entries (or none), got {len(self.trainable_bytes)}"
            )

    @property
    def num_blocks(self) -> int:
        """L."""
        return len(self.forward_flops)

    @property
    def flops_per_sample_block(self) -> float:
        """o_l + o'_l of the heaviest block: the per-block cost the segment scheduler uses.

        The scheduler treats TEBs as identical (delta_k counts blocks, order free); taking the heaviest
        block keeps every modelled delay an upper bound when blocks differ slightly.
        """
        return max(f + b for f, b in zip(self.forward_flops, self.backward_flops))

    @property
    def forward_flops_per_sample_block(self) -> float:
        """o_l of the heaviest block's forward: what a re-materialized micro-batch's backward computes again per
        sample and block (``pipeline.checkpoint``), on top of :attr:`flops_per_sample_block` (a bound as above)."""
        return max(self.forward_flops)

    @property
    def activation_bytes_per_sample(self) -> float:
        """z^s per sample at the widest block boundary (bytes)."""
        return max(self.boundary_bytes)

    @property
    def encoder_bytes(self) -> float:
        """theta^enc: bytes of all L blocks."""
        return float(sum(self.param_bytes))

    @property
    def encoder_upload_bytes(self) -> float:
        """What of theta^enc a CU uploads: the trainable bytes of all L blocks (all of theta^enc without LoRA)."""
        return float(sum(self.trainable_bytes)) if self.trainable_bytes else self.encoder_bytes

    @property
    def encoder_memory_bytes(self) -> float:
        """L gamma_0: C7's memory for training the whole encoder on one device at the whole batch b (GPipe's bound),
        as counted on the blocks (memory_scale 1). A network preset's ``device.memory_share`` is a share of this
        (``NetworkSpec.sized_to``)."""
        return float(self.num_blocks * self.block_memory_bytes()) / self.memory_scale

    @property
    def saved_bytes_per_sample(self) -> float:
        """The activation bytes the heaviest block keeps per sample for the backward (x memory_scale)."""
        return float(max(self.saved_bytes)) * self.memory_scale

    def with_memory_scale(self, scale: float) -> Workload:
        """This workload with gamma_0 multiplied by ``scale`` (the measured peaks over the model's figure)."""
        return dataclasses.replace(self, memory_scale=float(scale))

    def block_static_bytes(self) -> float:
        """The part of gamma_0 that does not depend on the batch, for one TEB: its weights, plus gradients and
        optimizer slots of the parameters that train (all of them without LoRA: weights x (2 + slots))."""
        if not self.trainable_bytes:
            return float(max(self.param_bytes) * (2 + self.optimizer_slots)) * self.memory_scale
        trainable = max(self.trainable_bytes) * (1 + self.optimizer_slots)
        return float(max(self.param_bytes) + trainable) * self.memory_scale

    def block_memory_bytes(self, m: int | None = None, S: int = 1, k: int = 0) -> float:
        """gamma_0 (C7): memory to train one TEB on stage k of S with m micro-batches: weights + gradients +
        optimizer slots + the saved activations of the samples the stage holds at once in full
        (``pipeline_model.held_activation_samples``): all b under GPipe (every micro-batch's activations live until
        its backward), min(b, ceil(b/m) min(m, S - k)) under 1F1B; with ``checkpoint`` one micro-batch's (two under
        1F1B with except_last), the other held ones only as segment inputs (:meth:`stage_memory_bytes`).
        ``m=None``: the whole batch (GPipe's figure, whatever the schedule: the bound that holds for every m)."""
        if m is None:
            return self.block_static_bytes() + self.saved_bytes_per_sample * self.batch_size
        full, _ = held_activation_samples(self.schedule, self.checkpoint, self.batch_size, m, S, k)
        return self.block_static_bytes() + self.saved_bytes_per_sample * full

    def checkpoint_input_bytes(self, m: int, S: int, k: int) -> float:
        """What stage k of S keeps of its checkpointed micro-batches whatever delta_k: their segment inputs z^s
        (``activation_bytes_per_sample`` each, x memory_scale); 0 without re-materialization."""
        _, inputs = held_activation_samples(self.schedule, self.checkpoint, self.batch_size, m, S, k)
        return float(self.activation_bytes_per_sample * inputs) * self.memory_scale

    def stage_memory_bytes(self, delta_k: int, m: int, S: int, k: int) -> float:
        """C7's left side for stage k of S holding delta_k TEBs, m micro-batches: delta_k gamma_0, plus the
        checkpointed micro-batches' inputs under ``checkpoint`` (:meth:`checkpoint_input_bytes`)."""
        fixed = self.checkpoint_input_bytes(m, S, k) if self.checkpoint is not Checkpoint.NEVER else 0.0
        return float(delta_k) * self.block_memory_bytes(m, S, k) + fixed

    def user_memory_bytes(self, users: int) -> float:
        """C7's left side for one of D = ``users`` VanillaFL data users: all L TEBs, trained on its share
        ceil(b / D) of the batch, every sample's activations held until its backward (GPipe's figure;
        ``ClusterModel.data_users`` counts the same share)."""
        share = math.ceil(self.batch_size / max(int(users), 1))
        return float(self.num_blocks) * (self.block_static_bytes() + self.saved_bytes_per_sample * share)

    def uplink_bits(self) -> float:
        """Bits CU n sends the BS per round (eq. 11): z_enc of every local step + theta^enc (+ embedding); of
        theta^enc only the trainable tensors (LoRA: the adapters)."""
        z_enc = self.boundary_bytes[-1] * self.batch_size * self.steps_per_round
        return 8.0 * (z_enc + self.encoder_upload_bytes + self.extra_upload_bytes)

    def to_dict(self) -> dict:
        """Every field (``checkpoint`` only when re-materializing, so the records of earlier runs stay the same)."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
        if self.checkpoint is Checkpoint.NEVER:
            del out["checkpoint"]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        kwargs: dict[str, Any] = {k: (tuple(float(x) for x in v) if isinstance(v, list) else v) for k, v in d.items()}
        return cls(**kwargs)

    @classmethod
    def paper_preset(
        cls, num_blocks: int = 12, batch_size: int = 64, seq_len: int = 128, hidden: int = 768
    ) -> Workload:
        """Table II: o_l = o'_l = 2e6 FLOPs (read per sample), b = 64, on a BERT-base-shaped encoder
        (L = 12, H = 768, T = 128, 4 bytes per value; the paper gives no sizes, these are BERT-base's)."""
        per_block_params = 12 * hidden * hidden + 13 * hidden  # 4 H^2 attention + 8 H^2 FFN (+ biases, LN)
        boundary = float(seq_len * hidden * 4)
        return cls(
            forward_flops=(2e6,) * num_blocks,
            backward_flops=(2e6,) * num_blocks,
            boundary_bytes=(boundary,) * (num_blocks + 1),
            param_bytes=(4.0 * per_block_params,) * num_blocks,
            saved_bytes=(boundary * 12,) * num_blocks,
            batch_size=batch_size,
        )


def _sdpa_cpu_forward(query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward(grad_out, query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def _extra_flop_formulas() -> dict[Any, Callable[..., int]]:
    aten = torch.ops.aten
    extra: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu_forward
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _sdpa_cpu_backward
    return extra


def _saved_bytes(fn: Callable[[], T]) -> tuple[T, float]:
    """Run ``fn()`` and add up the bytes autograd saves for backward (each storage counted once)."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, float(total)


@dataclass(frozen=True)
class RoundShape:
    """What one round runs, as :class:`Workload` records it: b = ``batch_size`` (None: the probe's B),
    ``steps_per_round`` local optimizer steps, and the pipeline's ``schedule`` (gpipe | 1f1b) and ``checkpoint``
    (never | except_last | always), both for C7."""

    batch_size: int | None = None
    steps_per_round: int = 1
    schedule: Schedule = Schedule.GPIPE
    checkpoint: Checkpoint = Checkpoint.NEVER


def measure_workload(
    blocks: nn.ModuleList,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    bytes_per_param: int | None = None,
    round_shape: RoundShape | None = None,
    embedding: nn.Module | None = None,
    head: nn.Module | None = None,
) -> Workload:
    """Count o_l, o'_l, saved activations and sizes on the real ``blocks`` with a probe ``hidden`` [B, T, H].

    ``round_shape``: b, the local steps per round and the schedule (default: ``RoundShape()``, b = the probe's
    B); ``embedding`` adds its parameters to the upload; ``head`` (the server-side decoder / task head) sets
    ``head_bytes``, which vanilla_fl uploads. Uploads count the trainable parameters; blocks with frozen ones
    (LoRA) also set ``trainable_bytes``. ``bytes_per_param``: None (default) counts every tensor in its real dtype
    (a bf16 frozen base, ``model.base_dtype``, is half an fp32 one); a number counts every element that size.
    """
    shape = round_shape if round_shape is not None else RoundShape()
    if hidden.dim() != 3:
        raise ConfigError(f"measure_workload needs hidden of shape [B, T, H], got {tuple(hidden.shape)}")
    B = int(hidden.shape[0])
    act_bytes = hidden.element_size() if bytes_per_param is None else bytes_per_param
    fwd, bwd, saved, params, boundary = [], [], [], [], [float(hidden[0].numel() * act_bytes)]
    trainable = [_count_bytes(blk, bytes_per_param, trainable=True) for blk in blocks]
    x = hidden.detach()
    extra = _extra_flop_formulas()
    was_training = [blk.training for blk in blocks]
    for blk in blocks:
        blk.train(False)  # no dropout noise in the probe; the FLOPs are the same
        inp = x.clone().requires_grad_(True)
        with FlopCounterMode(display=False, custom_mapping=extra) as counter:
            out, saved_total = _saved_bytes(functools.partial(blk, inp, attention_mask))
        fwd.append(counter.get_total_flops() / B)
        saved.append(saved_total / B)
        with FlopCounterMode(display=False, custom_mapping=extra) as counter:
            out.backward(torch.ones_like(out))
        bwd.append(counter.get_total_flops() / B)
        blk.zero_grad(set_to_none=True)
        params.append(_count_bytes(blk, bytes_per_param))
        boundary.append(float(out[0].numel() * act_bytes))
        x = out.detach()
    for blk, mode in zip(blocks, was_training):
        blk.train(mode)
    embedding_bytes = _count_bytes(embedding, bytes_per_param, trainable=True) if embedding is not None else 0.0
    return Workload(
        forward_flops=tuple(fwd),
        backward_flops=tuple(bwd),
        boundary_bytes=tuple(boundary),
        param_bytes=tuple(params),
        saved_bytes=tuple(saved),
        batch_size=int(shape.batch_size or B),
        steps_per_round=int(shape.steps_per_round),
        extra_upload_bytes=embedding_bytes,
        head_bytes=_count_bytes(head, bytes_per_param, trainable=True) if head is not None else 0.0,
        trainable_bytes=tuple(trainable) if trainable != params else (),
        schedule=shape.schedule,
        checkpoint=shape.checkpoint,
    )


def _count_bytes(module: nn.Module, bytes_per_param: int | None, trainable: bool = False) -> float:
    """Bytes of ``module``'s parameters (``trainable``: of those with requires_grad only), each in its own dtype
    (``bytes_per_param`` None) or at ``bytes_per_param`` bytes an element."""
    return float(
        sum(
            p.numel() * (p.element_size() if bytes_per_param is None else bytes_per_param)
            for p in module.parameters()
            if p.requires_grad or not trainable
        )
    )
