"""The tokenizer of a Hugging Face causal LM: the model folder's own, or a byte-level BPE trained once here.

- ``model.hf_folder`` set: ``AutoTokenizer.from_pretrained(folder, local_files_only=True)`` (a hub id only with
  ``model.allow_hub``; with ``model.gguf_file`` the tokenizer inside the GGUF file, from the folder the GGUF cache
  writes once per machine, models/hf/gguf_cache.py);
- a from-scratch model (no folder): a byte-level BPE (GPT-2's scheme: every byte string is encodable, no
  unknown token) trained with ``tokenizers`` on the training file, saved as a Hugging Face tokenizer folder
  under ``<cache_dir>/tokenizers/`` and loaded back with ``AutoTokenizer``. The folder's name hashes the
  training file's content and the settings (a changed file or setting trains a new one); it is written to a
  temporary folder and renamed, so several CUs may build it at once. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.generation import special_ids  # noqa: F401 - the task reads the ids through here
from collapipe_flwr.models.packaged import resolve_folder

BOUNDARY = "<|endoftext|>"  # begin / end of a sequence (GPT-2's token), also the unknown token
PAD = "<pad>"
DEFAULTS = {"vocab_size": 2000, "min_frequency": 2}


def check_settings(settings: Any) -> dict[str, int]:
    """``task.tokenizer`` {vocab_size, min_frequency} of the trained tokenizer, with defaults."""
    settings = settings or {}
    if not isinstance(settings, Mapping):
        raise ConfigError("task.tokenizer must be a mapping {vocab_size, min_frequency}")
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown config key task.tokenizer.{unknown[0]}; valid keys are vocab_size, min_frequency")
    out = {**DEFAULTS, **settings}
    for key, least in (("vocab_size", 260), ("min_frequency", 1)):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"task.tokenizer.{key}={value!r} must be an integer >= {least}")
    return out


def folder_tokenizer(source: str, allow_hub: bool = False, gguf_file: str = ""):
    """The tokenizer stored with the model (``local_files_only`` unless the hub is allowed): the folder's tokenizer
    files, or with ``gguf_file`` the tokenizer inside that GGUF file (of a local folder: read from the folder the GGUF
    cache writes once per machine, models/hf/gguf_cache.py). ``source`` may be ``package:...`` (models/packaged.py),
    resolved here."""
    from transformers import AutoTokenizer

    folder = resolve_folder(source)
    local = Path(folder).expanduser().is_dir()
    if not local and not allow_hub:  # parse_model refuses this earlier; never download by accident
        raise ConfigError(f"model.hf_folder={source!r} is not a local folder and model.allow_hub is false")
    if local and gguf_file:
        from collapipe_flwr.models.hf.gguf_cache import cached_base, damaged_entry

        entry = cached_base(source, gguf_file)
        try:
            return AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
        except Exception as err:  # noqa: BLE001 - a damaged tokenizer file raises anything from OSError on
            raise damaged_entry(entry, err) from None
    try:
        return AutoTokenizer.from_pretrained(
            str(Path(folder).expanduser()) if local else source,
            local_files_only=local,
            **({"gguf_file": gguf_file} if gguf_file else {}),
        )
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"cannot load the tokenizer of model.hf_folder={source!r} ({str(err).splitlines()[0][:120]}); the folder "
            "needs its tokenizer files (tokenizer.json or vocab + merges)"
        ) from None


def train_byte_bpe(lines: Sequence[str], vocab_size: int, min_frequency: int):
    """A ``PreTrainedTokenizerFast`` byte-level BPE trained on ``lines`` (special tokens <|endoftext|>, <pad>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[BOUNDARY, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(lines), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOUNDARY, eos_token=BOUNDARY, unk_token=BOUNDARY, pad_token=PAD
    )


def cached_byte_bpe(cache_dir: Path, source: Path | Sequence[Path], lines: Sequence[str], settings: Mapping[str, int]):
    """The byte-level BPE of (the content of ``source``, one file or several, ``settings``) from ``cache_dir``,
    trained on ``lines`` and saved if absent."""
    from transformers import AutoTokenizer

    key = json.dumps({**settings, "kind": "byte_bpe", "v": 1}, sort_keys=True).encode()
    files = [source] if isinstance(source, (str, Path)) else list(source)
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files) + key).hexdigest()[:16]
    folder = Path(cache_dir) / "tokenizers" / f"hf-byte-bpe-{digest}"
    if not (folder / "tokenizer.json").is_file():
        _save_folder(train_byte_bpe(lines, settings["vocab_size"], settings["min_frequency"]), folder)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _save_folder(tokenizer, folder: Path) -> None:
    """``save_pretrained`` into a temporary folder renamed to ``folder`` (another process's copy wins)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.")
    except OSError as err:
        raise ConfigError(
            f"cannot write the tokenizer cache {folder}: {err.strerror}; set task.cache_dir or COLLAPIPE_CACHE_DIR "
            "to a writable folder"
        ) from None
    try:
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "tokenizer.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
