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
pickle: load only checkpoints your own runs wrote.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapipe_flwr.atomic_files import replace_atomically
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.server_state import ServerState

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1


def checkpoint_path(folder: str | Path) -> Path:
    return Path(folder) / CHECKPOINT_FILE


def capture(server: ServerState, t: int) -> dict[str, Any]:
    """Everything the server needs to continue after round t (see the module docstring)."""
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
        "server_optimizer": server.global_model.server_optimizer,
        "decoder_optimizer": host.optimizer.state_dict() if host is not None and host.optimizer is not None else None,
        "policy": server.planner.policy.state_dict(),
        "profiles": server.planner.profiles.state_dict(),  # the kept measured profiles (system.profile: measured)
        "cu_state_key": server.cu_state_key,  # names the CUs' own checkpoints of their moments (fl/cu/cu_checkpoint.py)
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }


def restore(server: ServerState, payload: dict[str, Any]) -> int:
    """Load a captured state into a freshly built server; returns the round it was captured after."""
    if payload.get("format") != FORMAT:
        raise ConfigError(
            f"checkpoint format {payload.get('format')!r} is not {FORMAT}; it was written by another version"
        )
    model = server.model
    model.embedding.load_state_dict(payload["model"]["embedding"])
    model.blocks.load_state_dict(payload["model"]["encoder"])
    model.head.load_state_dict(payload["model"]["head"])
    server.global_model.cluster_parts = dict(payload["cluster_parts"])
    server.global_model.server_optimizer = payload["server_optimizer"]
    host = server.decoder.host
    if payload["decoder_optimizer"] is not None and host is not None and host.optimizer is not None:
        host.optimizer.load_state_dict(payload["decoder_optimizer"])
    server.planner.policy.load_state_dict(payload["policy"])
    server.planner.profiles.load_state_dict(payload.get("profiles", {}))  # none in checkpoints before profiles
    if payload.get("cu_state_key"):
        server.cu_state_key = str(payload["cu_state_key"])
    rng = payload["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    return int(payload["round"])


def save_checkpoint(folder: str | Path, server: ServerState, t: int) -> Path:
    """Write round t's checkpoint atomically (temporary file + ``os.replace``)."""
    path = checkpoint_path(folder)
    state = capture(server, t)
    replace_atomically(path, lambda fh: torch.save(state, fh))
    return path


def load_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The checkpoint of a run folder; a one-line ConfigError when there is none or it cannot be read."""
    path = checkpoint_path(folder)
    if not path.is_file():
        raise ConfigError(f"resume=true but {path} does not exist; the run never completed a round, start it afresh")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, EOFError, pickle.UnpicklingError, RuntimeError) as err:
        raise ConfigError(f"cannot read the checkpoint {path} ({err}); start the run afresh") from None
    if not isinstance(payload, dict) or "round" not in payload:
        raise ConfigError(f"{path} is not a CollaPipe checkpoint; start the run afresh")
    return payload
