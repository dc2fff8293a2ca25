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

The file is a safetensors file (format 2; the ``.pt`` name is kept from format 1, a torch pickle): tensors
and a header of strings, read without unpickling anything, so a file cannot run code in the CU. The header
binds the file to its run and cluster: ``key``, ``cluster``, ``round`` and a SHA-256 over those and every
tensor's name, dtype, shape and bytes (it finds damage and edits by hand; whoever can write the folder can
write a consistent file, which is why the folder is the user's own). The key folder is created with mode
0o700; a key folder or a file that is a symbolic link is never followed. Loading verifies the checksum before
it uses any header field (a round edited by hand is refused, never taken as a reason to skip the file). It
gives None when there is no file, or when the file holds a later round's moments (the server died after the CU
saved round t but before its own checkpoint of round t: that round runs again); a file that exists but cannot
be used (a text file, a pickle, a truncated file, another run's or cluster's state, a checksum that does not
match) is a one-line :class:`CUStateError` naming the file and why, so the CU's round fails with it instead of
silently training on fresh moments.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import torch

from collapipe_flwr.atomic_files import file_errors, replace_atomically_by_name
from collapipe_flwr.errors import CannotContinue

STATE_DIR_ENV = "COLLAPIPE_CU_STATE_DIR"
FORMAT = 2  # 2: safetensors + header with a checksum; 1 was a torch.save pickle
KIND = "collapipe-cu-state"  # the header's "kind": what the file is
BOUND = ("kind", "format", "key", "cluster", "round")  # the header's fields the checksum covers, with the tensors
_KEY = re.compile(r"[0-9A-Za-z_-]{1,64}")  # the server draws 16 hex digits (fl/server/server_main.py)
_PICKLE_STARTS = (b"PK\x03\x04", b"\x80")  # a torch.save zip archive, a plain pickle


class CUStateError(CannotContinue):
    """A CU state file that exists but cannot be used (damaged, foreign, another run's, a symbolic link)."""


def state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV, "").strip()
    return Path(explicit).expanduser() if explicit else Path.home() / ".cache" / "collapipe-flwr" / "cu-state"


def state_path(key: str, cluster: int) -> Path:
    """``<state dir>/<key>/cluster<n>.pt``; a key that is not a plain token (it names a folder) is refused."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise CUStateError(
            f"the CU state key {key!r} is not a run key (1-64 letters, digits, - or _); the server runs another version"
        )
    return state_dir() / key / f"cluster{int(cluster)}.pt"


def save_cu_state(key: str, cluster: int, round_: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write cluster n's moments after round t (one-line CollaPipeError on a full or read-only disk, a
    CUStateError when the key folder or the file is a symbolic link)."""
    path = state_path(key, cluster)
    with file_errors(path.parent, "create the CU state folder"):
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.parent.mkdir(mode=0o700)
        except FileExistsError:
            pass
    _refuse_links(path, cluster)
    flat = {name: _contiguous(t) for name, t in tensors.items()}
    metadata = {
        "kind": KIND,
        "format": str(FORMAT),
        "key": key,
        "cluster": str(int(cluster)),
        "round": str(int(round_)),
    }
    metadata["sha256"] = digest(flat, metadata)
    _write_atomically(path, flat, metadata)
    return path


def load_cu_state(key: str, cluster: int, before: int, reset: bool = False) -> dict[str, torch.Tensor] | None:
    """Cluster n's moments saved after a round before ``before``; None when there is no file, when it holds
    a later round's moments, or with ``reset`` (``federation.optimizer_state: reset`` starts every round
    fresh, so no file is read). A file that exists but cannot be used is a one-line CUStateError."""
    if reset:
        return None
    path = state_path(key, cluster)
    _refuse_links(path, cluster)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _unusable(path, cluster, f"it cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(mode):
        raise _unusable(path, cluster, "it is not a regular file")
    tensors, meta = _read(path, cluster)
    saved_round = _checked_header(path, key, cluster, tensors, meta)
    if not saved_round < int(before):
        return None  # a later round's moments: that round runs again, from fresh moments as a CU without state
    bad = next((name for name in tensors if name.count("|") != 2), None)
    if bad is not None:
        raise _unusable(path, cluster, f"it holds a tensor {bad!r} that is not named part|parameter|moment")
    return tensors


def _checked_header(path: Path, key: str, cluster: int, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> int:
    """The round a file's header names, once its checksum is verified (no field of an altered header is used,
    not even to skip the file) and it is this run's and cluster's state; else a CUStateError saying why."""
    if meta.get("sha256") != digest(tensors, meta):
        if meta.get("kind") != KIND or meta.get("format") != str(FORMAT):
            raise _unusable(path, cluster, f"it is not CU state of format {FORMAT} (header {_header_text(meta)})")
        raise _unusable(path, cluster, "its checksum does not match its header and tensors (altered or damaged)")
    if meta.get("kind") != KIND or meta.get("format") != str(FORMAT):
        raise _unusable(path, cluster, f"it is not CU state of format {FORMAT} (header {_header_text(meta)})")
    if meta.get("key") != key:
        raise _unusable(path, cluster, f"it belongs to the run with key {meta.get('key')!r}, not to this run ({key!r})")
    if meta.get("cluster") != str(int(cluster)):
        raise _unusable(path, cluster, f"it holds cluster {meta.get('cluster')}'s state, not cluster {int(cluster)}'s")
    saved_round = meta.get("round", "")
    if not (saved_round.isascii() and saved_round.isdigit()):
        raise _unusable(path, cluster, f"its header's round {saved_round!r} is not a round number")
    return int(saved_round)


def remove_cu_state(key: str, cluster: int) -> None:
    """The run is over: its CU state file (and the key's folder once empty) goes. Nothing is removed through
    a key folder that is a symbolic link, or for a key that is not a run key."""
    try:
        path = state_path(key, cluster)
    except CUStateError:
        return
    if path.parent.is_symlink():
        return
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


def digest(tensors: dict[str, torch.Tensor], header: dict[str, str]) -> str:
    """SHA-256 over the header's binding (:data:`BOUND`: kind, format, key, cluster, round), then every tensor's
    name, dtype, shape and bytes in name order."""
    h = hashlib.sha256(json.dumps([header.get(k, "") for k in BOUND]).encode("utf-8") + b"\n")
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode("utf-8") + b"\n")
        data = t.to("cpu").contiguous().reshape(-1)
        if data.numel():
            h.update(data.view(torch.uint8).numpy().data)
    return h.hexdigest()


# ----------------------------------------------------------------------------- helpers
def _contiguous(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _unusable(path: Path, cluster: int, reason: str) -> CUStateError:
    return CUStateError(
        f"cannot use the CU state file {path}: {reason}; delete it to start cluster {int(cluster)}'s optimizer "
        "moments afresh"
    )


def _refuse_links(path: Path, cluster: int) -> None:
    """The key folder and the file are used only when they are not symbolic links (never followed)."""
    for p in (path.parent, path):
        if p.is_symlink():
            raise CUStateError(
                f"the CU state {'folder' if p == path.parent else 'file'} {p} is a symbolic link, which is not "
                f"followed; remove it (cluster {int(cluster)}'s optimizer moments then start afresh)"
            )


def _read(path: Path, cluster: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The file's tensors and header; anything unreadable is a CUStateError that says what the file looks like."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            meta = dict(fh.metadata() or {})
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (OSError, SafetensorError, ValueError, RuntimeError, TypeError, KeyError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0][:120]
        if _starts_with(path, _PICKLE_STARTS):
            reason = (
                "it is a pickle (CU state of format 1, or not CollaPipe's), which is not loaded since unpickling "
                "can run code"
            )
        else:
            reason = f"it is truncated or not a CU state file ({first})"
        raise _unusable(path, cluster, reason) from None
    return tensors, meta


def _starts_with(path: Path, prefixes: tuple[bytes, ...]) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return any(head.startswith(p) for p in prefixes)


def _header_text(meta: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(meta.items()) if k in ("kind", "format"))[:120] or "empty"


def _write_atomically(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """safetensors' writer into a temporary file of the folder (mode 0o600), synced and moved over ``path``:
    a reader sees the old file or the new one. No copy of the tensors is made (at BERT-base size they are the
    round's 680 MB of moments)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    replace_atomically_by_name(
        path, lambda tmp: save_file(tensors, tmp, metadata=metadata), (RuntimeError, SafetensorError)
    )
