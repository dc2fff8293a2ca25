"""The server's state after a complete round, saved atomically so a killed run can resume (``resume=true``).

What round t leaves behind and round t+1 needs, all of it on the server:
- the global model: theta^emb, theta^enc and the head (its parameters), and each cluster's own parts for
  methods without aggregation;
- the server optimizer (``federation.server_optimizer``: FedAvgM's momentum, FedAdam's moments ...);
- the decoder's optimizer state (Adam moments of the head trained over the data plane);
- the policy's Lyapunov queues Y_n (eq. 29), its last losses and its random generator;
- the measured profiles the planner keeps (``system.profile: measured``);
- the key of the CUs' own checkpoints of their optimizer moments (fl/cu/cu_checkpoint.py), which the CUs write
  on their side after every round;
- the process's torch, NumPy and Python random states.
Not included, because it lives on the CUs: the CU-side optimizer moments (``federation.optimizer_state:
keep``), which each CU checkpoints on its own disk (fl/cu/cu_checkpoint.py), and the CUs' own random state. A
resumed run therefore continues exactly as the uninterrupted one when the model has no dropout noise on the
CUs (docs/federated_training.md).

The file is ``<run folder>/checkpoint.pt``, written to a temporary file first and moved into place with
``os.replace``, so a crash mid-write leaves the previous round's checkpoint intact. It is a ``torch.save``
archive of tensors and plain Python values only (dicts, lists, tuples, strings, numbers): the server
optimizer's moments, the NumPy random state and the policy's generator are converted to those when captured
and rebuilt when restored. It is read back with ``torch.load(weights_only=True)``, whose unpickler builds
tensors and plain values and nothing else, so a file someone else put there cannot run code in the
ServerApp: a pickle that names any other Python object (a ``__reduce__`` calling ``os.system``, or a
checkpoint of format 1, which held the server optimizer object itself), a text file or a truncated file is
refused with one line naming the file (a :class:`ConfigError`). Nor can a file make it allocate more than this
run's state: every size it claims is bounded before anything of that size exists (torch_archive.py,
checkpoint_fit.py), on the launcher's pre-check and on the ServerApp's own resume alike.
"""

from __future__ import annotations

import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapipe_flwr.atomic_files import replace_atomically
from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.server.checkpoint_fit import check_fits, check_round, check_tensors
from collapipe_flwr.fl.server.server_state import ServerState
from collapipe_flwr.torch_archive import check_archive, materialized

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 2  # 2: plain values and tensors only, read with weights_only=True; 1 pickled the server optimizer object
KEYS = ("format", "round", "model", "cluster_parts", "server_optimizer", "decoder_optimizer", "policy", "rng")
# What Flower's strategies carry from round to round (fl/server/aggregation/server_optimizer.py): FedAvgM's
# momentum (a list of NumPy arrays), FedOpt's m_t and v_t (dicts of NumPy arrays). Their current arrays are set
# again every round.
STRATEGY_STATE = ("momentum_vector", "m_t", "v_t")
_PICKLED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
ZIP_MAGIC = b"PK\x03\x04"  # how every torch.save archive starts


def checkpoint_path(folder: str | Path) -> Path:
    return Path(folder) / CHECKPOINT_FILE


def capture(server: ServerState, t: int) -> dict[str, Any]:
    """Everything the server needs to continue after round t (see the module docstring), as tensors and plain
    values that ``torch.load(weights_only=True)`` reads back."""
    model = server.model
    host = server.decoder.host
    return {
        "format": FORMAT,
        "round": int(t),
        "model": {
            "embedding": model.embedding.state_dict(),
            "encoder": model.blocks.state_dict(),
            "head": model.head.state_dict(),
        },
        "cluster_parts": server.global_model.cluster_parts,
        "server_optimizer": server_optimizer_state(server.global_model.server_optimizer),
        "decoder_optimizer": host.optimizer.state_dict() if host is not None and host.optimizer is not None else None,
        "policy": plain(server.planner.policy.state_dict()),
        "profiles": plain(server.planner.profiles.state_dict()),  # the kept measured profiles (system.profile)
        "cu_state_key": server.cu_state_key,  # names the CUs' own checkpoints of their moments (fl/cu/cu_checkpoint.py)
        "rng": {"torch": torch.get_rng_state(), "numpy": numpy_rng_state(), "python": random.getstate()},
    }


def restore(server: ServerState, payload: dict[str, Any], source: str | Path = "the checkpoint") -> int:
    """Load a captured state (:func:`load_checkpoint`'s, from ``source``) into a freshly built server; returns
    the round it was captured after. Every tensor is first held to this run's shapes (checkpoint_fit.py), then
    copied out of the file's mapping; a payload that does not fit this run is a one-line ConfigError."""
    if payload.get("format") != FORMAT:
        raise ConfigError(
            f"checkpoint format {payload.get('format')!r} is not {FORMAT}; it was written by another version"
        )
    check_round(payload, Path(source))
    check_fits(server, payload, Path(source))
    payload = materialized(payload)
    try:
        model = server.model
        model.embedding.load_state_dict(payload["model"]["embedding"])
        model.blocks.load_state_dict(payload["model"]["encoder"])
        model.head.load_state_dict(payload["model"]["head"])
        server.global_model.cluster_parts = dict(payload["cluster_parts"])
        load_server_optimizer_state(server.global_model.server_optimizer, payload["server_optimizer"])
        host = server.decoder.host
        if payload["decoder_optimizer"] is not None and host is not None and host.optimizer is not None:
            host.optimizer.load_state_dict(payload["decoder_optimizer"])
        server.planner.policy.load_state_dict(payload["policy"])
        server.planner.profiles.load_state_dict(payload.get("profiles", {}))
        if payload.get("cu_state_key"):
            server.cu_state_key = str(payload["cu_state_key"])
        rng = payload["rng"]
        torch.set_rng_state(rng["torch"])
        load_numpy_rng_state(rng["numpy"])
        random.setstate(rng["python"])
        return int(payload["round"])
    except CollaPipeError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise ConfigError(f"the checkpoint does not fit this run ({_short(err)}); start the run afresh") from None


def save_checkpoint(folder: str | Path, server: ServerState, t: int) -> Path:
    """Write round t's checkpoint atomically (temporary file + ``os.replace``)."""
    path = checkpoint_path(folder)
    state = capture(server, t)
    replace_atomically(path, lambda fh: torch.save(state, fh))
    return path


def load_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The checkpoint of a run folder, read without running any code from it (``weights_only=True``) and with
    its tensors mapped from the file, not read (``mmap=True``); a one-line ConfigError naming the file when
    there is none, it cannot be read, it holds anything but tensors and plain values, it is of another format,
    or a size it claims is not bounded (torch_archive.py, checkpoint_fit.py: compressed or oversized records, sparse or
    expanded tensors, a round that is not a non-negative int). Cheap enough for the launcher's pre-check; the
    ServerApp's :func:`restore` then holds the tensors to the model's shapes."""
    path = checkpoint_path(folder)
    if not path.is_file():
        raise ConfigError(f"resume=true but {path} does not exist; the run never completed a round, start it afresh")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(ZIP_MAGIC))
    except OSError as err:
        raise ConfigError(f"cannot read the checkpoint {path} ({err.strerror}); start the run afresh") from None
    if head != ZIP_MAGIC:  # a text file, a bare pickle, an empty file: never handed to an unpickler
        what = "an empty file" if not head else "not a torch.save archive"
        raise ConfigError(f"{path} is not a checkpoint ({what}); start the run afresh")
    check_archive(path)  # before torch reads a record: none compressed, none larger than the file
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        raise ConfigError(_refused(path, err)) from None
    except Exception as err:  # a damaged archive fails as RuntimeError, KeyError, EOFError ...
        raise ConfigError(
            f"cannot read the checkpoint {path} ({_short(err)}): it is truncated or damaged; start the run afresh"
        ) from None
    if not isinstance(payload, dict) or any(key not in payload for key in KEYS):
        raise ConfigError(f"{path} is not a CollaPipe checkpoint; start the run afresh")
    if payload["format"] != FORMAT:
        raise ConfigError(
            f"{path} is a checkpoint of format {payload['format']!r}; this version reads format {FORMAT} only: "
            "start the run afresh"
        )
    check_round(payload, path)
    check_tensors(payload, path)
    return payload


# ----------------------------------------------------------------------------- plain values
def plain(value: Any) -> Any:
    """``value`` with NumPy scalars and arrays turned into Python numbers and lists (the policy's and the
    profiles' state dicts, which a ``weights_only`` load would refuse if a NumPy type slipped in)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def numpy_rng_state() -> dict[str, Any]:
    """``np.random.get_state()`` (a tuple holding a uint32 array) as a tensor and plain values."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),  # uint32 values, held exactly by int64
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def load_numpy_rng_state(state: dict[str, Any]) -> None:
    keys = np.asarray(state["keys"].numpy(), dtype=np.uint32)
    np.random.set_state(
        (state["kind"], keys, int(state["pos"]), int(state["has_gauss"]), float(state["cached_gaussian"]))
    )


def _tensor(array: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True))  # a copy: the strategy's next step makes new arrays anyway


def server_optimizer_state(optimizer: ServerOptimizer) -> dict[str, Any]:
    """What a :class:`ServerOptimizer` carries between rounds, as tensors: its Flower strategy's moments
    (:data:`STRATEGY_STATE`, NumPy arrays there) and the layout of the parameters they belong to. Its
    hyperparameters come from the run's config, which a resumed run must repeat."""
    state: dict[str, Any] = {"name": str(optimizer.name), "layout": optimizer._layout}  # a str: weights_only loads it
    for attr in STRATEGY_STATE:
        value = getattr(optimizer.strategy, attr, None)
        if isinstance(value, dict):
            state[attr] = {str(k): _tensor(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            state[attr] = [_tensor(v) for v in value]
        else:
            state[attr] = None
    return state


def load_server_optimizer_state(optimizer: ServerOptimizer, state: dict[str, Any]) -> None:
    """Put :func:`server_optimizer_state`'s values back into a freshly built optimizer of the same config."""
    if state["name"] != optimizer.name:
        raise ConfigError(
            f"the checkpoint's server optimizer is {state['name']!r}, this run's {optimizer.name!r}; "
            "resume with the run's own federation.server_optimizer"
        )
    layout = state["layout"]
    optimizer._layout = None if layout is None else tuple((str(k), tuple(int(n) for n in s)) for k, s in layout)
    for attr in STRATEGY_STATE:
        value = state.get(attr)
        if not hasattr(optimizer.strategy, attr):
            continue
        if isinstance(value, dict):
            setattr(optimizer.strategy, attr, {k: v.numpy() for k, v in value.items()})
        elif isinstance(value, list):
            setattr(optimizer.strategy, attr, [v.numpy() for v in value])
        else:
            setattr(optimizer.strategy, attr, None)


# ----------------------------------------------------------------------------- refusals
def _short(err: BaseException) -> str:
    """The telling line of an error (torch's weights_only messages are paragraphs of advice around it)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    noise = ("weights only load failed", "weights_only", "check the documentation", "please file an issue")
    telling = [line for line in lines if not any(n in line.lower() for n in noise)]
    first = telling[0].split(". ")[0].rstrip(".")[:100] if telling else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _refused(path: Path, err: pickle.UnpicklingError) -> str:
    """The one line for a checkpoint the weights_only unpickler refused."""
    found = _PICKLED_GLOBAL.search(str(err))
    if found is None:
        return f"cannot read the checkpoint {path} ({_short(err)}): it is damaged; start the run afresh"
    name = found.group(1)
    if name.startswith("collapipe_flwr."):
        return (
            f"{path} is a checkpoint of format 1 (an earlier version, which pickled {name}); this version reads "
            f"format {FORMAT} only, since loading Python objects can run code: start the run afresh, or finish it "
            "with the version that wrote it"
        )
    return (
        f"{path} is not a checkpoint this version loads: its pickle calls {name}, which could run code; refused. "
        "Start the run afresh"
    )
