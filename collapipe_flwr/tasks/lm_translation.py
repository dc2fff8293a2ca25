"""A causal LM fine-tuned as a translator (``task=causal_lm task.format=translation``): its options and its BLEU.

The causal_lm task's formatting options (tasks/causal_lm.py), typed and checked once at start-up:

- ``task.format``: ``text`` (one text a line, the default) | ``translation`` (aligned source / target files);
- ``task.chat_template``: false | true, the pair written in the tokenizer's chat template (translation only);
- ``task.translation``: the pair files of each split (line i of ``*_src`` aligned with line i of ``*_tgt``; by
  default the raw cased Multi30K En-De files), the prompt's labels (``English`` / ``German``) and the BLEU settings:
  ``bleu_examples`` (the first N validation pairs, a fixed subset), ``max_new_tokens`` and sacrebleu's tokenizer.

Each pair is written by :class:`~collapipe_flwr.models.hf.prompting.PromptFormat`, the one formatting function
training, evaluation and ``generate`` call. BLEU: the split model's adapters merged into an un-split Hugging Face
model, greedy decoding with the helper ``generate`` uses (models/hf/generation.py; it stops at end-of-sequence, at a
newline token or after ``max_new_tokens``, and keeps the first line), corpus BLEU (sacrebleu) against the targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.prompting import FormatKind, PromptFormat
from collapipe_flwr.spec_parsing import check_keys, choice, require
from collapipe_flwr.tasks.data_files import resolve_file
from collapipe_flwr.tasks.file_options import require_test_files
from collapipe_flwr.tasks.metrics import corpus_bleu
from collapipe_flwr.tasks.translation import SentencePair, read_parallel

BLEU_TOKENIZERS = ("13a", "intl", "none", "char")


@dataclass(frozen=True)
class LmTranslationSpec:
    """``task.translation``: the pair files, the prompt's labels, and how BLEU is measured (module docstring)."""

    train_src: str = "multi30k/train.en"
    train_tgt: str = "multi30k/train.de"
    val_src: str = "multi30k/val.en"
    val_tgt: str = "multi30k/val.de"
    test_src: str = ""
    test_tgt: str = ""
    source_label: str = "English"
    target_label: str = "German"
    bleu_examples: int = 128
    max_new_tokens: int = 48
    bleu_tokenize: str = "13a"
    generate_batch: int = 16

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                require(isinstance(value, str), f"task.translation.{f.name}={value!r} must be text")
            else:
                require(
                    isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                    f"task.translation.{f.name}={value!r} must be an integer >= 0",
                )
        for key in ("train_src", "train_tgt", "val_src", "val_tgt", "source_label", "target_label"):
            require(bool(getattr(self, key)), f"task.translation.{key} is empty; name it")
        for key in ("max_new_tokens", "generate_batch"):
            require(getattr(self, key) >= 1, f"task.translation.{key}={getattr(self, key)} must be >= 1")
        require(
            self.bleu_tokenize in BLEU_TOKENIZERS,
            f"task.translation.bleu_tokenize={self.bleu_tokenize!r} must be one of {', '.join(BLEU_TOKENIZERS)}",
        )


def parse_lm_translation(raw: Any) -> LmTranslationSpec:
    """``task.translation`` (absent: the defaults) as a spec; unknown keys refused naming the valid ones."""
    raw = raw or {}
    require(isinstance(raw, Mapping), "task.translation must be a mapping {train_src, train_tgt, ...}")
    check_keys("task.translation", raw, {f.name for f in fields(LmTranslationSpec)})
    return LmTranslationSpec(**raw)


def prompt_format(options: Mapping[str, Any]) -> PromptFormat:
    """The :class:`PromptFormat` of a causal_lm task's options (``format``, ``chat_template``, ``translation``'s
    labels); a wrong value is a one-line ConfigError naming the key and its choices."""
    kind = choice("task.format", options.get("format") or FormatKind.TEXT, FormatKind)
    chat = options.get("chat_template", False)
    require(isinstance(chat, bool), f"task.chat_template={chat!r} must be true or false")
    spec = parse_lm_translation(options.get("translation"))
    return PromptFormat(kind, chat, spec.source_label, spec.target_label)


def read_pairs(data_dir: Path, options: Mapping[str, Any], split: str) -> tuple[SentencePair, ...]:
    """The aligned (source, target) pairs of ``split`` from ``task.translation.<split>_src / _tgt``."""
    spec = parse_lm_translation(options.get("translation"))
    keys = (f"{split}_src", f"{split}_tgt")
    require_test_files(split, {k: getattr(spec, k, "") for k in keys}, keys)
    if split not in ("train", "val", "test"):
        raise ConfigError(f"split {split!r} has no translation files; use train, val or test")
    src, tgt = (resolve_file(data_dir, getattr(spec, k), f"causal_lm translation {k}") for k in keys)
    return read_parallel(src, tgt)


def train_files(data_dir: Path, options: Mapping[str, Any]) -> list[Path]:
    """The training pairs' two files (what a tokenizer trained on them hashes)."""
    spec = parse_lm_translation(options.get("translation"))
    return [resolve_file(data_dir, getattr(spec, k), f"causal_lm translation {k}") for k in ("train_src", "train_tgt")]


def bleu_of(model: Any, tokenizer: Any, pairs: tuple[SentencePair, ...], options: Mapping[str, Any]) -> dict:
    """``bleu`` (corpus BLEU of greedy translations of the first ``bleu_examples`` pairs) and ``bleu_examples``, by
    the split ``model``'s adapters merged into the un-split Hugging Face model (the model itself is unchanged)."""
    from collapipe_flwr.models.hf.generation import Sampling, continuations
    from collapipe_flwr.models.hf.peft_export import merged_copy, unsplit_model

    spec = parse_lm_translation(options.get("translation"))
    chosen = pairs[: spec.bleu_examples]
    if not chosen:
        return {}
    device = next(model.embedding.parameters()).device
    net = unsplit_model(model.embedding, merged_copy(model.blocks), model.head).to(device)
    sampling = Sampling(max_new_tokens=spec.max_new_tokens, greedy=True)
    sources = [p.src for p in chosen]
    hypotheses = continuations(net, tokenizer, sources, sampling, prompt_format(options), spec.generate_batch)
    bleu = corpus_bleu(hypotheses, [p.tgt for p in chosen], tokenize=spec.bleu_tokenize)
    return {"bleu": bleu, "bleu_examples": float(len(chosen))}
