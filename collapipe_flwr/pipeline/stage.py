"""One pipeline stage: device k's segment theta^s (delta_k TEBs) and its optimizer.

The same class runs in-process (backend "local") and inside a Ray actor (backend "ray", see
``executors/ray_actor.py``). Per micro-batch i it keeps what backward needs between ``forward`` and
``backward``: the detached input leaf and the output with its graph; under ``pipeline.checkpoint`` (``always``, or
``except_last`` for every micro-batch but the last) only the leaf, and its backward first recomputes the segment's
forward from it (``pipeline/recompute.py``). Gradients accumulate over the m micro-batches; ``step`` applies one
optimizer update (GPipe's synchronous update).

Emulation (optional): after each forward/backward the stage sleeps ``(slowdown - 1) x`` its compute
time, so a device with relative throughput phi_k f_k / max_j(phi_j f_j) = 1 / slowdown takes
``slowdown`` times as long as the fastest device would (eq. (15)'s delta_k (b_hat o_l + o'_l) / (phi_k f_k)).

Accelerator (``runtime.device``): the stage resolves ``device`` (auto | cpu | cuda) and ``precision`` in its
own process, holds its segment and optimizer state there, and moves each incoming activation / gradient
onto it. With ``host_io`` (a Ray actor: what it returns crosses a process) its outputs go back as CPU
tensors; in-process stages hand device tensors straight to the next stage. Weights and optimizer state
leave as CPU tensors (aggregation, checkpoints, moving blocks between devices).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from collapipe_flwr.accelerator import resolve_device, to_host
from collapipe_flwr.errors import TestbedError
from collapipe_flwr.pipeline import profiling
from collapipe_flwr.pipeline.device_process import DeviceProcess, this_process
from collapipe_flwr.pipeline.dropout_seed import seed_block
from collapipe_flwr.pipeline.memory import SavedTensorMeter, optimizer_state_bytes, param_bytes
from collapipe_flwr.pipeline.optim import OptimizerSpec, scale_lr
from collapipe_flwr.pipeline.process_memory import ProcessMemory
from collapipe_flwr.pipeline.recompute import Held, RngState, saved_dropped
from collapipe_flwr.pipeline.timings import CallCpu, StageSeconds
from collapipe_flwr.precision import autocast, resolve_precision
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.pipeline_model import Checkpoint, checkpoint_stop
from collapipe_flwr.testbed.cpu_quota import CpuQuota
from collapipe_flwr.testbed.token_bucket import TokenBucket

# the testbed's D2D token bucket passes this much at once: each hand-over then takes bytes / r_k^dd, as eq. (13)
LINK_BURST_BYTES = 4096
# the testbed's CFS period: a quota of c cores runs c x 10 ms in every 10 ms, so a throttled device is slow
# evenly, as a slower CPU is, instead of fast for c x 100 ms and stopped for the rest of a 100 ms default period
QUOTA_PERIOD_US = 10_000


def emulation_slowdowns(devices: Sequence[DeviceProfile], used: Sequence[int]) -> dict[int, float]:
    """slowdown_k = max_j(phi_j f_j) / (phi_k f_k) over the devices used (the fastest runs at 1)."""
    fastest = max(devices[k].flops_per_second for k in used)
    return {k: fastest / devices[k].flops_per_second for k in used}


@dataclass(frozen=True)
class StageCompute:
    """Where and how a stage computes (see the module docstring): ``device`` (auto | cpu | cuda) and ``precision``
    as the config names them, resolved in the stage's own process; ``host_io``: its outputs go back as CPU tensors
    (a Ray actor, whose results cross a process); ``checkpoint``: ``pipeline.checkpoint`` (never | except_last |
    always), which micro-batches the stage re-materializes."""

    device: str = "cpu"
    precision: str = "fp32"
    host_io: bool = False
    checkpoint: str = "never"


class Stage:
    """Device k's segment: forward / backward per micro-batch, step, weights, memory report."""

    def __init__(
        self,
        device_index: int,
        segment: nn.ModuleList,
        optimizer: OptimizerSpec,
        optimizer_state: dict | None = None,
        slowdown: float = 1.0,
        offset: int = 0,
        compute: StageCompute | None = None,
        process_memory: ProcessMemory | None = None,
    ) -> None:
        compute = compute if compute is not None else StageCompute()
        self.device_index = device_index
        self.optimizer_spec = optimizer
        self.device = resolve_device(compute.device)
        self.host_io = bool(compute.host_io)
        self.precision = resolve_precision(compute.precision, self.device.type)
        self.checkpoint = Checkpoint(compute.checkpoint)
        self.load_segment(segment, optimizer_state, slowdown, offset)
        self._pending: dict[int, Held] = {}
        self._step_seed: int | None = None
        self._checkpoint_stop = 0  # micro-batches i < this one are re-materialized this step
        self._live_activation_bytes = 0
        self.peak_activation_bytes = 0
        self.compute_seconds = 0.0
        self.link_seconds = 0.0
        self._trace: list[tuple[str, int, float, float]] = []
        self._calls: list[CallCpu] = []
        self._cpu_start: float | None = None
        self.link: TokenBucket | None = None  # the testbed's D2D throttle on what this stage hands on
        self.cpu_quota: CpuQuota | None = None  # the testbed's CPU share of this process
        # this process's memory figures and the testbed's limit (a device actor's own process; None in the CU's)
        self.process_memory = process_memory

    def load_segment(self, segment: nn.ModuleList, optimizer_state: dict | None, slowdown: float, offset: int) -> int:
        """Hold ``segment`` (blocks ``offset .. offset + len - 1`` of the encoder) from now on: used when the
        CU moves blocks between live devices (a new delta), so the actor process is never restarted."""
        self.segment = segment.to(self.device)
        self.segment.train()
        self.offset = int(offset)
        self.reset_optimizer()
        if optimizer_state:
            self.load_optimizer_state(optimizer_state)
        self.slowdown = max(1.0, float(slowdown))
        self._pending = {}
        return self.device_index

    def process(self) -> DeviceProcess:
        """This device's OS process and network namespace (pipeline/device_process.py)."""
        return this_process()

    def layout(self) -> tuple[int, int]:
        """(first, last + 1): the encoder blocks this device holds."""
        return self.offset, self.offset + len(self.segment)

    def reset_optimizer(self) -> None:
        """Fresh optimizer state (``federation.optimizer_state: reset``); none for an idle (empty) device."""
        self.optimizer = self.optimizer_spec.build(self.segment.parameters())
        self._base_lrs = [group["lr"] for group in self.optimizer.param_groups]

    # -- the step ---------------------------------------------------------------------------------
    def begin_step(self, step_seed: int | None = None, micro_batches: int | None = None) -> int:
        """Start a training step: zero gradients and drop anything left from a failed step. ``step_seed``
        (``runtime.seeded_dropout``): each block's dropout masks this step come from it (pipeline/dropout_seed.py);
        ``micro_batches``: the step's m, which ``pipeline.checkpoint=except_last`` needs (None: unknown)."""
        self._step_seed = step_seed
        if micro_batches is None and self.checkpoint is Checkpoint.EXCEPT_LAST:
            raise ValueError(f"device {self.device_index}: pipeline.checkpoint=except_last needs the step's m")
        self._checkpoint_stop = checkpoint_stop(
            self.checkpoint, sys.maxsize if micro_batches is None else micro_batches
        )
        self.optimizer.zero_grad(set_to_none=True)
        self._pending.clear()
        self._live_activation_bytes = 0
        self.compute_seconds = 0.0
        self.link_seconds = 0.0
        self._trace = []
        self._calls = []
        # the CPU of this device's own process over the step (StageSeconds.cpu); none in the CU's process
        self._cpu_start = time.process_time() if self.process_memory is not None else None
        return self.device_index

    def forward(self, mb_index: int, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """z^{s+1} = segment(z^s) for micro-batch ``mb_index``; keeps the graph for :meth:`backward`, or only the
        input leaf when the micro-batch is checkpointed (``pipeline/recompute.py``)."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        leaf = x.detach().to(self.device).requires_grad_(True)
        attention_mask = attention_mask.to(self.device)
        if mb_index < self._checkpoint_stop:
            held = Held(leaf, None, 0, attention_mask, RngState.capture(self.device))
            with saved_dropped():
                hidden = self._segment_forward(mb_index, leaf, attention_mask)
            with SavedTensorMeter(exclude=self.segment.parameters()) as meter:
                meter.count(leaf)  # what the stage itself holds until the backward: z^s
            held.saved = meter.bytes
        else:
            with SavedTensorMeter(exclude=self.segment.parameters()) as meter:
                hidden = self._segment_forward(mb_index, leaf, attention_mask)
            held = Held(leaf, hidden, meter.bytes)
        self._pending[mb_index] = held
        self._live_activation_bytes += held.saved
        self.peak_activation_bytes = max(self.peak_activation_bytes, self._live_activation_bytes)
        out = self._out(hidden.detach())
        self._account(start, cpu_start, "F", mb_index, out)
        return self._send(out)

    def _segment_forward(self, mb_index: int, leaf: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The delta_k blocks on micro-batch ``mb_index``, each block's dropout seeded (``runtime.seeded_dropout``),
        under the stage's precision; the output in the input's dtype (what stages exchange)."""
        hidden = leaf
        with autocast(self.precision, self.device.type):
            for j, block in enumerate(self.segment):
                seed_block(self._step_seed, mb_index, self.offset + j)
                hidden = block(hidden, attention_mask)
        return hidden.to(leaf.dtype)

    def _recompute(self, mb_index: int, held: Held) -> torch.Tensor:
        """A checkpointed micro-batch's forward again, from its leaf and with the generators its forward had,
        under the meter: its transient activations (its input counted once) on top of what the stage holds of the
        other micro-batches count in ``peak_activation_bytes``."""
        if held.rng is None or held.mask is None:  # unreachable: forward sets both for a checkpointed micro-batch
            raise RuntimeError(f"device {self.device_index}: micro-batch {mb_index} was not checkpointed")
        with held.rng.replayed(), SavedTensorMeter(exclude=self.segment.parameters()) as meter:
            meter.count(held.leaf)
            out = self._segment_forward(mb_index, held.leaf, held.mask)
        live = self._live_activation_bytes - held.saved + meter.bytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, live)
        return out

    def backward(self, mb_index: int, grad_out: torch.Tensor) -> torch.Tensor:
        """dL/dz^s from dL/dz^{s+1} for micro-batch ``mb_index``; accumulates the segment's gradients (first
        recomputing a checkpointed micro-batch's forward)."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        if mb_index not in self._pending:
            raise RuntimeError(f"device {self.device_index}: backward of micro-batch {mb_index} without its forward")
        held = self._pending.pop(mb_index)
        out = held.out if held.out is not None else self._recompute(mb_index, held)
        torch.autograd.backward(out, grad_out.to(self.device))
        self._live_activation_bytes -= held.saved
        leaf = held.leaf
        grad_in = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        result = self._out(grad_in)
        self._account(start, cpu_start, "B", mb_index, result)
        return self._send(result)

    def _out(self, tensor: torch.Tensor) -> torch.Tensor:
        return to_host(tensor) if self.host_io else tensor

    def _send(self, tensor: torch.Tensor) -> torch.Tensor:
        """Hand ``tensor`` on over this device's link: on the testbed the link's token bucket holds it for its
        bytes at r_k^dd plus the per-transfer latency (eq. 13's tau_k^dd, tau_0); otherwise at once. The seconds it
        holds are this step's ``link_seconds`` (D2D), kept apart from its compute seconds."""
        if self.link is not None:
            start = time.perf_counter()
            self.link.consume(tensor.numel() * tensor.element_size())
            self.link_seconds += time.perf_counter() - start
        return tensor

    # -- the testbed and measurement (system/profile.py) ---------------------------------------------
    def set_testbed(
        self, cores: float, bytes_per_s: float, latency_s: float, cgroup_name: str, memory_bytes: float = 0.0
    ) -> float:
        """Emulate this device: its process under a CPU quota of ``cores`` (0 = none), its outgoing link
        throttled to ``bytes_per_s`` with ``latency_s`` per transfer (0 = unthrottled) and, with ``memory_bytes``
        > 0, its memory cgroup limited to gamma_k^max (C7; the process joined it at start,
        ``pipeline/process_memory.py``). Returns the cores the cgroup now grants (read back), 0 without a quota."""
        if memory_bytes > 0:
            if self.process_memory is None or self.process_memory.cgroup is None:
                raise TestbedError(
                    f"device {self.device_index} was started without a memory cgroup, so gamma_k^max cannot be "
                    "enforced; start its actor with runtime.memory_cgroup=true (testbed.memory_limit sets it)"
                )
            self.process_memory.set_limit(memory_bytes)
        if cores <= 0 and self.cpu_quota is not None:
            self.cpu_quota.remove()
            self.cpu_quota = None
        elif cores > 0 and self.cpu_quota is None:
            self.cpu_quota = CpuQuota.apply(os.getpid(), cores, cgroup_name, period_us=QUOTA_PERIOD_US)
        elif cores > 0 and self.cpu_quota is not None and abs(self.cpu_quota.read_back() - cores) > 1e-9:
            self.cpu_quota.set_cores(cores)  # a new round's f_k(t): the same cgroup, a new quota
        self.link = TokenBucket(bytes_per_s, LINK_BURST_BYTES, latency_s) if bytes_per_s > 0 else None
        return self.cpu_quota.read_back() if self.cpu_quota is not None else 0.0

    def clear_testbed(self) -> None:
        """Back to the host's full CPU and an unthrottled link (the cgroup removed), memory unlimited."""
        if self.process_memory is not None and self.process_memory.cgroup is not None:
            self.process_memory.set_limit(None)
        if self.cpu_quota is not None:
            self.cpu_quota.remove()
            self.cpu_quota = None
        self.link = None

    def profile_compute(self, block: nn.Module, sizes: list[int], seq_len: int, width: int, repeats: int) -> dict:
        """Time one TEB (a copy of ``block``) forward + backward at each micro-batch size, as this stage runs it
        (its device, precision and emulated slowdown); with the memory this device may use."""

        def slowdown(elapsed: float) -> float:
            extra = (self.slowdown - 1.0) * elapsed if self.slowdown > 1.0 else 0.0
            if extra:
                time.sleep(extra)
            return extra

        seconds = profiling.time_block(block, sizes, seq_len, width, repeats, self.device, self.precision, slowdown)
        return {"sizes": list(sizes), "seconds": seconds, "memory_bytes": profiling.memory_limit_bytes()}

    def send_payload(self, nbytes: int) -> torch.Tensor:
        """An ``nbytes`` payload handed on over this device's link (the D2D measurement's sending side)."""
        return self._send(profiling.payload(nbytes))

    def receive_payload(self, tensor: torch.Tensor) -> int:
        """The receiving side of a D2D measurement: the payload's size once it is here."""
        return int(tensor.numel() * tensor.element_size())

    def step(self, lr_factor: float = 1.0) -> StageSeconds:
        """One optimizer update of theta^s with the gradients of all m micro-batches at ``lr_factor`` times
        the base lr (model.lr_schedule); returns this step's compute and D2D link seconds. Refused while a
        micro-batch's backward has not run (its forward's graph still held): a step that failed part-way never
        applies part of its gradients (the driver submits the update behind the backward, pipeline/gpipe.py)."""
        if self._pending:
            left = sorted(self._pending)
            self._pending.clear()
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(
                f"device {self.device_index}: no update, the backward of micro-batch(es) {left} did not run this "
                "step (an earlier call of the step failed); the step is dropped"
            )
        cpu_start = time.thread_time()
        scale_lr(self.optimizer, self._base_lrs, lr_factor)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._calls.append(CallCpu("U", -1, time.thread_time() - cpu_start))
        cpu = time.process_time() - self._cpu_start if self._cpu_start is not None else 0.0
        return StageSeconds(self.compute_seconds, self.link_seconds, cpu, tuple(self._calls))

    def _account(self, start: float, cpu_start: float, kind: str, mb_index: int, out: torch.Tensor) -> None:
        if self.device.type == "cuda":  # the kernels queued so far are this call's compute time
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        # the virtual clock's measure: this thread's CPU on the call, before any emulated slowdown's sleep
        self._calls.append(CallCpu(kind, mb_index, time.thread_time() - cpu_start, out.numel() * out.element_size()))
        if self.process_memory is not None:
            self.process_memory.sample()  # a stage's memory peaks around its forwards and backwards
        if self.slowdown > 1.0:
            time.sleep((self.slowdown - 1.0) * elapsed)
        end = time.perf_counter()
        self.compute_seconds += end - start
        wall_end = time.time()
        self._trace.append((kind, mb_index, wall_end - (end - start), wall_end))

    def trace(self) -> list[tuple[str, int, float, float]]:
        """(F|B, micro-batch, wall start, wall end) of this step's calls, for schedule checks and plots."""
        return list(self._trace)

    # -- state ------------------------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """theta^s with local block numbers ``"{j}.{param}"`` (see ``models.split.concat_segments``)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.segment.state_dict().items()}

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.segment.load_state_dict(state, strict=True)

    def get_optimizer_state(self) -> dict[str, dict]:
        """Optimizer state per local parameter name (for moving blocks between devices)."""
        names = {id(p): n for n, p in self.segment.named_parameters()}
        return {
            names[id(p)]: {k: (v.to("cpu", copy=True) if torch.is_tensor(v) else v) for k, v in s.items()}
            for p, s in self.optimizer.state.items()
        }

    def load_optimizer_state(self, state: dict[str, dict]) -> None:
        for name, p in self.segment.named_parameters():
            if name in state:
                # as torch.optim.Optimizer.load_state_dict does: state on the parameter's device, except the
                # step counter, which non-capturable optimizers keep on the CPU
                self.optimizer.state[p] = {
                    k: (v.to(v.device if k == "step" else p.device, copy=True) if torch.is_tensor(v) else v)
                    for k, v in state[name].items()
                }

    def memory_report(self) -> dict:
        """Bytes this device holds: parameters, optimizer state and peak saved activations (counted on the
        tensors: ``peak_bytes``), and in a device process of its own what the OS measured this round
        (``pipeline/process_memory.py``: ``measured_peak_bytes``, ``rss_peak_bytes``, ``cgroup_peak_bytes``,
        ``limit_bytes``), whose peaks then restart for the next round."""
        params = param_bytes(self.segment)
        optim = optimizer_state_bytes(self.optimizer)
        measured = self.process_memory.peaks(reset=True) if self.process_memory is not None else {}
        return {
            "device": self.device_index,
            "blocks": len(self.segment),
            "param_bytes": params,
            "optimizer_bytes": optim,
            "peak_activation_bytes": self.peak_activation_bytes,
            "peak_bytes": params + optim + self.peak_activation_bytes,
            **measured,
        }

    def ping(self) -> int:
        return self.device_index

    def warm_up(self, modules: Sequence[str]) -> list[str]:
        """Import ``modules`` (the code of the encoder's blocks) now, while this device is idle: a segment is
        pickled, so the first one this process receives would otherwise import its classes (at BERT size,
        transformers' ``modeling_bert``: about 3 s) inside the round whose plan first uses this device. Returns
        the modules that could not be imported; the segment's own load then raises the real error."""
        failed = []
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  # a warm-up only; load_segment reports what is wrong
                failed.append(name)
        return failed

    def missing_modules(self, modules: Sequence[str]) -> list[str]:
        """Those of ``modules`` this process has not imported (what a :meth:`warm_up` has still to do)."""
        return [name for name in modules if name not in sys.modules]
