"""A LoRA causal LM's adapters after round t, in PEFT's format: ``<run>/model/rounds/<t>/peft/``.

Each round's folder is what ``model/peft/`` is at the end of a run (peft_export.py: ``adapter_config.json``,
``adapter_model.safetensors``, ``base_model.json``), over the same base ``model/base/`` (peft_base.py): the base
of a LoRA run is frozen, so it is written once, with the first round's adapters, and every round's folder names
it. A round's folder is filled beside its place and swapped in whole (peft_export.replace_folder): a reader sees
a complete folder or none. :func:`keep_newest` and :func:`drop_after` bound what stays (``round_adapters.keep``;
a resumed run drops the rounds after the one it resumes from, which it trains again).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from peft import LoraConfig
from torch import nn

from collapipe_flwr.atomic_files import file_errors
from collapipe_flwr.models.hf.peft_base import BASE_DIR
from collapipe_flwr.models.hf.peft_export import ADAPTER_CONFIG, replace_folder, write_adapter_folder, write_base

ROUNDS_DIR = "rounds"
PEFT_DIR = "peft"


def round_folder(model_dir: Path, t: int) -> Path:
    """``model_dir/rounds/<t>/peft``: round t's adapters."""
    return model_dir / ROUNDS_DIR / str(int(t)) / PEFT_DIR


def kept_rounds(model_dir: Path) -> list[int]:
    """The rounds whose adapters ``model_dir/rounds/`` holds, oldest first."""
    folder = model_dir / ROUNDS_DIR
    if not folder.is_dir():
        return []
    found = (p.name for p in folder.iterdir() if p.name.isdigit() and (p / PEFT_DIR / ADAPTER_CONFIG).is_file())
    return sorted(int(name) for name in found)


def write_round(
    model_dir: Path,
    t: int,
    parts: tuple[nn.Module, nn.ModuleList, nn.Module],
    lora: LoraConfig,
    source: str = "",
    gguf_file: str = "",
) -> Path:
    """Round t's adapters (the TEBs of ``parts``) into :func:`round_folder`, over ``model_dir/base`` (written
    first from ``parts`` when it is not there, with the tokenizer files of ``model_dir/tokenizer``). ``source``,
    ``gguf_file``: the run's ``model.hf_folder`` and ``model.gguf_file`` as configured, recorded in
    ``base_model.json``."""
    base_dir = model_dir / BASE_DIR
    with file_errors(model_dir, "create"):
        model_dir.mkdir(parents=True, exist_ok=True)
    if not (base_dir / "config.json").is_file():
        write_base(model_dir, parts, model_dir / "tokenizer")
    folder = round_folder(model_dir, t)
    with file_errors(folder.parent, "create"):
        folder.parent.mkdir(parents=True, exist_ok=True)
    replace_folder(folder, lambda tmp: write_adapter_folder(tmp, parts[1], lora, base_dir, source, gguf_file))
    return folder


def _drop(model_dir: Path, rounds: list[int]) -> None:
    for t in rounds:
        shutil.rmtree(model_dir / ROUNDS_DIR / str(t), ignore_errors=True)


def keep_newest(model_dir: Path, keep: int) -> list[int]:
    """Remove all but the ``keep`` newest rounds' adapters (0: keep all); returns the rounds removed."""
    rounds = kept_rounds(model_dir)
    old = rounds[: max(len(rounds) - keep, 0)] if keep > 0 else []
    _drop(model_dir, old)
    return old


def drop_after(model_dir: Path, t: int) -> list[int]:
    """Remove the adapters of every round after t (a run resumed after round t trains them again)."""
    later = [r for r in kept_rounds(model_dir) if r > t]
    _drop(model_dir, later)
    return later
