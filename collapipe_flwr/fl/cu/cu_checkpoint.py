"""The CU's half of a checkpoint: its optimizer moments after each round, on the CU's own disk, so that a run
resumed with ``federation.optimizer_state: keep`` continues as the uninterrupted run would have.

The server's ``checkpoint.pt`` holds what lives on the server (fl/server/checkpoint.py); the Adam moments of the
embedding, the device segments and a CU-trained head live on the CU and its devices, and a resumed run starts
new CU processes and new device actors. So, when the server checkpoints and the moments are kept, every CU
writes them after each round to ``<COLLAPIPE_CU_STATE_DIR or ~/.cache/collapipe-flwr/cu-state>/<key>/
cluster<n>.pt`` (replaced atomically), where ``key`` names the run: a random token the server draws when the
run starts, keeps in its own checkpoint and sends in the train instructions. A CU that starts a round without
its moments in its process or in Flower's ``Context.state`` (the first round of a resumed run) loads that file
(the moments of its last round before this one, as the interrupted CU process held them). On a deployment the
folder is on the CU's box; the resumed run finds it there as long as the CU's box is the same one. The file is
removed when the run releases the CU.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from collapipe_flwr.atomic_files import replace_atomically

STATE_DIR_ENV = "COLLAPIPE_CU_STATE_DIR"
FORMAT = 1


def state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV, "").strip()
    return Path(explicit).expanduser() if explicit else Path.home() / ".cache" / "collapipe-flwr" / "cu-state"


def state_path(key: str, cluster: int) -> Path:
    return state_dir() / key / f"cluster{int(cluster)}.pt"


def save_cu_state(key: str, cluster: int, round_: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write cluster n's moments after round t (one-line CollaPipeError on a full or read-only disk)."""
    path = state_path(key, cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "key": key, "cluster": int(cluster), "round": int(round_), "tensors": tensors}
    replace_atomically(path, lambda fh: torch.save(payload, fh))
    return path


def load_cu_state(key: str, cluster: int, before: int) -> dict[str, torch.Tensor] | None:
    """Cluster n's moments saved after a round before ``before``, or None when there is no such file (another
    run, a later round, a damaged file: the round then starts with fresh moments, as a CU without state does)."""
    path = state_path(key, cluster)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError):
        return None
    if (
        not isinstance(payload, dict)
        or payload.get("format") != FORMAT
        or payload.get("key") != key
        or payload.get("cluster") != int(cluster)
        or not isinstance(payload.get("round"), int)
        or not payload["round"] < int(before)
    ):
        return None
    tensors = payload.get("tensors")
    return tensors if isinstance(tensors, dict) else None


def remove_cu_state(key: str, cluster: int) -> None:
    """The run is over: its CU state file (and the key's folder once empty) goes."""
    path = state_path(key, cluster)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass
