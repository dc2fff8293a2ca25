"""Hand-over of activations and gradients between a CU and its device actors through shared memory.

With Ray's object store, each hand-over of z^s (stage s -> s+1 in the forward pass, dL/dz^s back) is a put
into the store by the producing actor, a location reply to the CU (the owner of every ObjectRef), the
dependent call pushed to the consumer, and a fetch there: about 4.8 ms for a 512 KB micro-batch on this
project's 2-core machine, with 10-12 such hops on a GPipe step's critical path (docs/benchmarks.md). When
every actor runs on the CU's host, the producer instead writes the tensor's bytes to a file in ``/dev/shm``
(memory, not disk) and returns a :class:`ShmTensor` naming it: a few hundred bytes, which Ray inlines in the
call's reply and the dependent call. The consumer reads the bytes back and removes the file. Ray still
orders the calls and reports a dead producer exactly as before; only the bytes take the short way (1.2 ms a
hop, measured the same way). On a whole GPipe step the gain is smaller than the hops suggest: at S = 2, m = 4
here, 0.746x of one device's step against 0.781x through the object store, over three runs.

Weights, optimizer state and blocks moving to a device (a new delta) take the same way
(:meth:`ParkingLot.handover_tree`, :func:`parked_module`). Through the object store they would cost more than
time: the store's pages they were written to and read from stay mapped into the device (``RssShmem``) and
charged to its memory cgroup, so a device's memory grew round after round (issue 43; docs/testbed.md).

Why by hand: Ray's object store already uses shared memory, but its ownership protocol routes every
object's location through the owner (the CU's process); ``multiprocessing.shared_memory`` would need a
resource tracker per process and leaks segments of killed actors. A file per tensor under one folder per
writer, removed by its reader (the folder with its last tensor), needs neither.

Folders: ``/dev/shm/collapipe-handoff-<pid>[-<tag>]`` per writer (:class:`ParkingLot`: a device actor, or one
pipeline of a CU's process). :func:`remove_stale` removes those of processes that are gone (a killed actor's
unread tensors).
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import TypeVar

import torch

from collapipe_flwr import shm_leftovers
from collapipe_flwr.pipeline.runtime_spec import Handoff

SHM_ROOT = shm_leftovers.SHM_DIR
FOLDER_PREFIX = shm_leftovers.HANDOFF_PREFIX
PARK_MIN_BYTES = 100 * 1024  # Ray's max_direct_call_object_size: smaller objects already travel inline
M = TypeVar("M", bound=torch.nn.Module)


@dataclass(frozen=True)
class ShmTensor:
    """A CPU tensor parked in shared memory: its file, shape and dtype (what crosses Ray instead of the bytes)."""

    path: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    nbytes: int


def available(root: Path = SHM_ROOT) -> bool:
    """Whether this host has a writable shared-memory file system at ``root`` (Linux's /dev/shm)."""
    return root.is_dir() and os.access(root, os.W_OK)


class ParkingLot:
    """One writer's hand-over folder, ``/dev/shm/collapipe-handoff-<pid>[-<tag>]``: a device actor has one, and
    each of a CU's pipelines one of its own (``tag``), so two pipelines of one process never sweep each other's
    tensors. The folder is made when a tensor is parked and removed by the reader of its last one (a Flower worker
    holding a CU's pipeline is killed at the run's end, with no chance to clean up)."""

    def __init__(self, root: Path = SHM_ROOT, tag: str = "", pid: int | None = None) -> None:
        self.root = root
        self.path = root / f"{FOLDER_PREFIX}{os.getpid() if pid is None else pid}{'-' + tag if tag else ''}"
        self._serial = count()

    def park(self, tensor: torch.Tensor) -> ShmTensor:
        """Write ``tensor`` (moved to the CPU, made contiguous) into this folder; returns its handle."""
        data = tensor.detach().to("cpu").contiguous()
        raw = data.view(-1).view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
        path = self.path / f"t{next(self._serial)}"
        for attempt in range(2):
            self.path.mkdir(mode=0o700, exist_ok=True)
            try:
                with open(path, "wb") as file:
                    file.write(raw.numpy().data)
                break
            except FileNotFoundError:  # a reader removed the emptied folder just now: make it again, once
                if attempt:
                    raise
            except OSError:
                path.unlink(missing_ok=True)  # no half-written tensor left behind
                raise
        return ShmTensor(str(path), tuple(data.shape), str(data.dtype).removeprefix("torch."), int(raw.numel()))

    def handover(self, value):
        """What this writer sends on: a tensor of at least :data:`PARK_MIN_BYTES` parked here, anything else as it
        is (Ray inlines small objects in the call itself, which is as short a way). A tensor that does not fit
        (the shared-memory file system is full) goes on as it is, through Ray's object store."""
        if torch.is_tensor(value) and value.numel() * value.element_size() >= PARK_MIN_BYTES:
            try:
                return self.park(value)
            except OSError:  # /dev/shm full (a container's default is 64 MiB): this one goes through Ray's store
                return value
        return value

    def handover_tree(self, value):
        """:meth:`handover` on every tensor inside ``value`` (nested dicts, lists and tuples: a state dict, an
        optimizer's state), so that weights take the short way too. Through Ray's object store they would stay
        charged to the process that wrote them: the store's pages, once touched, stay mapped into it (RssShmem)
        and in its memory cgroup, tens of MiB a round (docs/testbed.md: measured)."""
        if isinstance(value, dict):
            return {k: self.handover_tree(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return _same_sequence(value, [self.handover_tree(v) for v in value])
        return self.handover(value)

    def clear(self) -> int:
        """Remove the unread tensors parked here (left by a step that failed); returns how many."""
        removed = 0
        for file in self.path.glob("t*") if self.path.is_dir() else []:
            try:
                file.unlink()
                removed += 1
            except FileNotFoundError:  # its reader took it meanwhile
                pass
        return removed

    def remove(self) -> None:
        """Remove this folder and anything still in it (its writer's end)."""
        shutil.rmtree(self.path, ignore_errors=True)


def fetch(handle: ShmTensor) -> torch.Tensor:
    """The tensor behind ``handle``, read into this process's memory; its file is removed."""
    dtype = getattr(torch, handle.dtype)
    raw = bytearray(handle.nbytes)
    try:
        with open(handle.path, "rb") as file:
            got = file.readinto(raw)
            extra = file.read(1)
        os.unlink(handle.path)
        try:  # the folder goes with its last tensor, so a writer killed at a run's end leaves nothing behind
            os.rmdir(os.path.dirname(handle.path))
        except OSError:  # other tensors wait there
            pass
    except FileNotFoundError:
        raise RuntimeError(
            f"the hand-over file {handle.path} is gone: read twice, or its writer's folder was swept; "
            "set runtime.handoff=object_store to hand tensors over through Ray's object store"
        ) from None
    if got != handle.nbytes or extra:
        raise RuntimeError(f"the hand-over file {handle.path} does not hold the {handle.nbytes} bytes its handle names")
    if not raw:
        return torch.empty(handle.shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(handle.shape)


def resolve(value):
    """``value`` itself, or the tensor behind it when it is a :class:`ShmTensor`."""
    return fetch(value) if isinstance(value, ShmTensor) else value


TRANSIENT_KEY = "__non_persistent_buffers__"  # never a state-dict name (those are dotted attribute names)


def parked_module(module: M, lot: ParkingLot) -> tuple[M, dict] | None:
    """``module`` as (a copy on the meta device: its structure without its weights, its state dict with the large
    tensors parked in ``lot``), so that blocks moving to a device skip Ray's object store as weights do; None
    when a parameter is shared between two of its modules (``to_empty`` would split it). Buffers a state dict
    leaves out (non-persistent: a Llama block's rotary ``inv_freq``, a few hundred bytes) travel in the state under
    :data:`TRANSIENT_KEY`, as they are, and :func:`unparked_module` puts them back."""
    state = module.state_dict()
    shared = len(list(module.named_parameters(remove_duplicate=False))) != len(list(module.parameters()))
    if shared:
        return None
    parked = lot.handover_tree(state)
    transient = {name: buf.detach().clone() for name, buf in module.named_buffers() if name not in state}
    if transient:
        parked[TRANSIENT_KEY] = transient
    return copy.deepcopy(module).to("meta"), parked


def unparked_module(skeleton: M, state: dict) -> M:
    """The module :func:`parked_module` took apart, rebuilt on the CPU from its parked state."""
    state = dict(state)
    transient = state.pop(TRANSIENT_KEY, {})
    module = skeleton.to_empty(device="cpu")
    module.load_state_dict(resolve_tree(state), strict=True)
    for name, value in transient.items():
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner).register_buffer(leaf, value, persistent=False)
    return module


def resolve_tree(value):
    """``value`` with every :class:`ShmTensor` inside it (nested dicts, lists, tuples) read back (:func:`fetch`)."""
    if isinstance(value, dict):
        return {k: resolve_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _same_sequence(value, [resolve_tree(v) for v in value])
    return resolve(value)


def _same_sequence(like: list | tuple, items: list):
    """``items`` as the sequence type of ``like``: a list, a tuple, or a named tuple (built field by field, as
    ``StageSeconds`` that a stage's step answers)."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*items)
    return type(like)(items)


def remove_stale(root: Path = SHM_ROOT) -> list[Path]:
    """Remove the hand-over folders of processes that no longer run; returns the folders removed
    (``shm_leftovers.remove_stale``)."""
    return shm_leftovers.remove_stale(FOLDER_PREFIX, root)


def choose(mode: str, cu_node: str, device_nodes: list[str], shm_ok: bool) -> Handoff:
    """The hand-over a cluster uses: ``runtime.handoff`` ``shm`` / ``object_store`` as set; ``auto`` picks
    ``shm`` when this host has /dev/shm and every device actor runs on the CU's node, else ``object_store``.
    ``shm`` asked for where it cannot work raises a ValueError naming why."""
    try:
        handoff = Handoff(mode)
    except ValueError:
        raise ValueError(f"runtime.handoff={mode!r} must be one of {', '.join(Handoff)}") from None
    elsewhere = [k for k, node in enumerate(device_nodes) if node != cu_node]
    if handoff is Handoff.SHM and (elsewhere or not shm_ok):
        why = f"device actors {elsewhere} run on another host" if elsewhere else f"{SHM_ROOT} is not writable here"
        raise ValueError(f"runtime.handoff=shm but {why}; use runtime.handoff=auto or object_store")
    if handoff is Handoff.AUTO:
        return Handoff.SHM if shm_ok and not elsewhere else Handoff.OBJECT_STORE
    return handoff
