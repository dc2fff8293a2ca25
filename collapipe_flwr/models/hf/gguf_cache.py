"""A GGUF base (``model.gguf_file``) dequantised once per machine into a cached Hugging Face folder that every
later process loads instead of the GGUF file.

Why: transformers reads a GGUF file (``from_pretrained(folder, gguf_file=...)``) by parsing all of its metadata in
Python (SmolLM2's 49,152 tokens and 48,900 merges) once for the config, once for the tokenizer and once more for
the weights, then dequantises every tensor: 20-30 s per process for SmolLM2-135M on the 2-core machine here,
paid by the server and by every CU of a run, and by ``generate``. The folder this module writes once (config.json,
model.safetensors in fp32, the tokenizer files: what ``save_pretrained`` writes) loads in a few seconds, its
weights memory-mapped by safetensors.

Where: ``$COLLAPIPE_GGUF_CACHE`` if set, else ``$XDG_CACHE_HOME/collapipe-flwr/gguf``, else
``~/.cache/collapipe-flwr/gguf``; one folder per GGUF file and key, ``<file stem>-<16 hex digits of the key>``.
Deleting the folder (or one entry) is always safe: the next start builds it again.

The key: the package's name and version (``package:<module>`` folders, models/packaged.py; else the file's
absolute path), the file's name, size and modification time (ns), the transformers version (its GGUF conversion
decides the weights and the tokenizer) and :data:`LAYOUT`. Not the file's content hash: hashing SmolLM2's 98 MB
takes 0.6 s (page cache warm, loaded machine) in every process at every start, and reading a cold file from disk
more, where a stat takes microseconds; a file replaced by another of the same size and time is the one case this
misses, and reinstalling a package or copying a file gives it a new time. The content's sha256 is computed once,
when the folder is built, and recorded in its manifest (which file it came from), not compared at each start.

Complete or not: the folder is written under a temporary name beside its final one and renamed into place when
complete, its manifest (:data:`MANIFEST`: the key, the GGUF file's sha256, every file's size) written last. A
folder whose manifest is missing, unreadable, of another key, or whose files are missing or of another size is
removed and built again; one that passes those checks but fails to load is a one-line error naming the folder and
how to clear it (:func:`damaged_entry`). Several processes starting at once (the server and the CUs of a run):
the first takes the entry's lock file (``filelock``, the lock huggingface_hub's own cache uses) and builds, the
others wait on the lock and then load its folder; should two builders still meet, the rename decides and the
loser's copy is discarded.

The folder is written with transformers' ``save_pretrained`` after the model's GGUF marker is detached: its
weights are already dequantised fp32 tensors, and transformers refuses to save a model loaded from GGUF only
because it cannot write the GGUF format back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.packaged import PREFIX, distribution, is_packaged, resolve_folder

CACHE_ENV = "COLLAPIPE_GGUF_CACHE"
MANIFEST = "collapipe-gguf.json"
LAYOUT = 1  # what this module writes into a folder; a change builds every entry again
LOCK_TIMEOUT_S = 1800.0  # waiting on another process's build (SmolLM2: under a minute, several on a loaded box)
_TMP_SUFFIX = ".partial"


def cache_root() -> Path:
    """The folder holding every cached base: ``$COLLAPIPE_GGUF_CACHE``, else ``$XDG_CACHE_HOME/collapipe-flwr/gguf``,
    else ``~/.cache/collapipe-flwr/gguf``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "collapipe-flwr" / "gguf"


def _origin(source: str, gguf: Path) -> str:
    """Where the file comes from: ``<distribution>==<version>[/<folder inside it>]`` of a ``package:`` folder, else
    its absolute path."""
    if is_packaged(source):
        package, _, sub = source[len(PREFIX) :].strip().strip("/").partition("/")
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{distribution(package)}=={metadata.version(distribution(package))}" + (f"/{sub}" if sub else "")
    return str(gguf.resolve())


def cache_key(source: str | Path, gguf_file: str) -> dict[str, Any]:
    """The key of the GGUF file ``gguf_file`` in the model folder ``source`` (``package:...`` resolved here)."""
    import transformers

    gguf = Path(resolve_folder(source)).expanduser() / gguf_file
    try:
        stat = gguf.stat()
    except OSError as err:
        raise ConfigError(
            f"model.gguf_file={gguf_file!r}: cannot read {gguf} ({err.strerror}); name a .gguf file of model.hf_folder"
        ) from None
    return {
        "origin": _origin(str(source), gguf),
        "file": gguf.name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
        "layout": LAYOUT,
    }


def entry_folder(key: dict[str, Any], root: Path | None = None) -> Path:
    """The cache folder of ``key``: ``<root>/<file stem>-<16 hex digits of the key>``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return (root or cache_root()) / f"{Path(key['file']).stem}-{digest}"


def is_complete(entry: Path, key: dict[str, Any]) -> bool:
    """Whether ``entry`` holds a manifest of ``key`` and every file the manifest lists, each of its size (stats
    only: no file is read but the manifest)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest["key"] != key or not isinstance(files, dict) or "model.safetensors" not in files:
            return False
        return all((entry / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def dequantise(gguf: Path, out: Path) -> None:
    """The model (fp32) and tokenizer of the GGUF file ``gguf``, loaded by transformers, saved into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collapipe_flwr.models.hf.quiet import quiet_transformers

    folder, name = str(gguf.parent), gguf.name
    with quiet_transformers():
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, local_files_only=True, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model.hf_quantizer = None  # the GGUF marker: the tensors are plain fp32 already
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _write_manifest(tmp: Path, key: dict[str, Any], gguf: Path) -> None:
    """The manifest, last: the key, the GGUF file's sha256 and every file's size (the files and the manifest synced
    to disk before the rename, so a crash cannot leave a renamed folder whose files were never written)."""
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    for name in files:
        fd = os.open(tmp / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    manifest = {"key": key, "gguf_sha256": _sha256(gguf), "files": files}
    with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def _remove(path: Path) -> None:
    """``path`` gone: renamed aside first (a reader never sees half a folder under the entry's name)."""
    if not path.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, aside / path.name)
    shutil.rmtree(aside, ignore_errors=True)


def _build(entry: Path, key: dict[str, Any], gguf: Path) -> None:
    """Write ``entry`` from ``gguf`` (the entry's lock held): leftovers of crashed builds and an incomplete entry
    removed, the folder written under a temporary name, its manifest last, then renamed into place."""
    for stale in entry.parent.glob(f".{entry.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    _remove(entry)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=_TMP_SUFFIX, dir=entry.parent))
    try:
        dequantise(gguf, tmp)
        _write_manifest(tmp, key, gguf)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not is_complete(entry, key):  # another builder's complete copy wins; anything else is an error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _cache_errors(entry: Path) -> Iterator[None]:
    """An OSError while writing the cache as one line naming the folder and what to do."""
    try:
        yield
    except OSError as err:
        raise ConfigError(
            f"cannot write the GGUF cache folder {entry}: {err.strerror or type(err).__name__}; free disk space "
            f"(about 4 bytes per parameter) or set {CACHE_ENV} to a writable folder"
        ) from None


def cached_base(source: str | Path, gguf_file: str) -> Path:
    """The cached Hugging Face folder of the GGUF file ``gguf_file`` in the model folder ``source`` (``package:...``
    resolved here), built when absent or incomplete; several processes at once build it once."""
    from filelock import FileLock, Timeout

    key = cache_key(source, gguf_file)
    entry = entry_folder(key)
    if is_complete(entry, key):
        return entry
    gguf = Path(resolve_folder(source)).expanduser() / gguf_file
    with _cache_errors(entry):
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(entry.parent / f"{entry.name}.lock"), timeout=LOCK_TIMEOUT_S):
                if not is_complete(entry, key):
                    _build(entry, key, gguf)
        except Timeout:
            raise ConfigError(
                f"another process has been writing {entry} for {LOCK_TIMEOUT_S:.0f} s; wait for it, or stop it and "
                "start again"
            ) from None
    return entry


def damaged_entry(entry: Path, err: BaseException) -> ConfigError:
    """The one line for a cache folder that passed its manifest's checks but failed to load."""
    first = (str(err).splitlines() or [type(err).__name__])[0][:120]
    return ConfigError(
        f"the cached GGUF base {entry} is damaged ({type(err).__name__}: {first}); remove it (rm -rf '{entry}') and "
        "start again: the next start builds it anew"
    )
