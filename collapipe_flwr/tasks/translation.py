"""Multi30K English -> German translation with the classic Transformer (paper Section VI.A, task i).

Data: by default the official lower-cased, punctuation-normalised, Moses-tokenised files
``multi30k/tok/{train,val}.lc.norm.tok.{en,de}`` (the raw cased files work too: set the file names).
Line i of the source file is aligned with line i of the target file.

Tokenizers: one subword tokenizer per side (BPE by default), trained on that side of the training split
and cached (tasks/bpe_tokenizer.py). Batches (docs/contracts.md): ``input_ids`` = source + [EOS],
``decoder_input_ids`` = [BOS] + target, ``labels`` = target + [EOS] with -100 at padding (teacher forcing).

Metric: corpus BLEU (sacrebleu) of the detokenised hypotheses -- subwords merged back into words --
against the reference lines of the target file, greedy (beam_size=1) or beam decoding. With the tok/
files, hypotheses and references are both lower-cased Moses-tokenised text and sacrebleu's 13a
tokenizer leaves them (almost) unchanged: this is the usual "tokenised, lower-cased" Multi30K BLEU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks import bpe_tokenizer, model_config
from collapipe_flwr.tasks.base import HUB_SPLITS, Task
from collapipe_flwr.tasks.batching import IGNORE_INDEX
from collapipe_flwr.tasks.data_files import resolve_file, text_lines
from collapipe_flwr.tasks.file_options import require_file_options, require_test_files
from collapipe_flwr.tasks.metrics import corpus_bleu
from collapipe_flwr.tasks.model_family import ModelFamily


@dataclass(frozen=True)
class SentencePair:
    src: str
    tgt: str


def read_parallel(src_path, tgt_path) -> tuple[SentencePair, ...]:
    """Aligned sentence pairs of two line-parallel files (whitespace normalised)."""
    src_lines, tgt_lines = text_lines(src_path), text_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataFormatError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
            "the source and target files must be line-aligned (one sentence a line)"
        )
    pairs = []
    for number, (s, t) in enumerate(zip(src_lines, tgt_lines), start=1):
        s, t = " ".join(s.split()), " ".join(t.split())
        if not s or not t:
            empty = src_path if not s else tgt_path
            raise DataFormatError(
                f"{empty}:{number}: empty line; each line must hold one sentence aligned with the other file"
            )
        pairs.append(SentencePair(s, t))
    return tuple(pairs)


class TranslationTask(Task):
    name = "translation"
    metric_name = "bleu"
    model_family = ModelFamily.TRANSFORMER
    task_keys = frozenset(
        {
            "train_src",
            "train_tgt",
            "val_src",
            "val_tgt",
            "test_src",
            "test_tgt",
            "tokenizer",
            "bleu_tokenize",
            "decode_extra_len",
            "label_smoothing",
        }
    )

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        require_file_options(options, ("train_src", "train_tgt", "val_src", "val_tgt"), noun="Multi30K file")
        smoothing = options.get("label_smoothing", 0.0)
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise ConfigError(
                f"task.label_smoothing={smoothing!r} must be a number in [0, 1) (0.1 is usual; 0 = plain cross-entropy)"
            )
        tok = options.get("tokenizer") or {}
        if not isinstance(tok, Mapping):
            raise ConfigError("task.tokenizer must be a mapping {kind, src_vocab_size, tgt_vocab_size, min_frequency}")
        unknown = sorted(set(tok) - {"kind", "src_vocab_size", "tgt_vocab_size", "min_frequency", "lowercase"})
        if unknown:
            raise ConfigError(
                f"unknown config key task.tokenizer.{unknown[0]}; "
                "valid keys are kind, lowercase, min_frequency, src_vocab_size, tgt_vocab_size"
            )
        for side in ("src", "tgt"):
            bpe_tokenizer.settings_key(
                tok.get("kind", "bpe"),
                tok.get(f"{side}_vocab_size", 8000),
                tok.get("min_frequency", 2),
                tok.get("lowercase", False),
            )

    # ---- data ----------------------------------------------------------------------------------
    def _files(self, split: str):
        src, tgt = self.options.get(f"{split}_src") or "", self.options.get(f"{split}_tgt") or ""
        require_test_files(split, self.options, ("test_src", "test_tgt"))
        return (
            resolve_file(self.data_dir, src, f"translation {split} source"),
            resolve_file(self.data_dir, tgt, f"translation {split} target"),
        )

    def read_split(self, split: str) -> Sequence[SentencePair]:
        return read_parallel(*self._files(split))

    def partition_labels(self) -> list[int]:
        """A sentence pair's label for the label-skewed partitions (a proxy: Multi30K has no topic label): the
        quartile of its source length in words over the training split (0 = shortest quarter .. 3 = longest), so
        a label-skewed cluster trains on sentences of one length range. Multi30K has one corpus: no domain split."""
        import numpy as np

        lengths = np.array([len(p.src.split()) for p in self.train_examples()])
        edges = np.quantile(lengths, [0.25, 0.5, 0.75])
        return [int(q) for q in np.searchsorted(edges, lengths, side="right")]

    def read_hf_split(self, split: str, hf: Mapping[str, Any]) -> Sequence[SentencePair]:
        """e.g. ``hf_dataset: {enabled: true, id: bentrevett/multi30k, src: en, tgt: de}`` (raw cased text)."""
        import datasets

        name = HUB_SPLITS[split]
        rows = datasets.load_dataset(hf.get("id", "bentrevett/multi30k"), split=hf.get(f"{split}_split", name))
        lower = bool((self.options.get("tokenizer") or {}).get("lowercase", False))
        pairs = []
        for row in rows:
            s, t = " ".join(row[hf.get("src", "en")].split()), " ".join(row[hf.get("tgt", "de")].split())
            pairs.append(SentencePair(s.lower() if lower else s, t.lower() if lower else t))
        return pairs

    # ---- tokenizers ----------------------------------------------------------------------------
    def tokenizers(self):
        """(source tokenizer, target tokenizer), trained on the training split and cached on disk."""
        if not hasattr(self, "_tokenizers"):
            settings = self.options.get("tokenizer") or {}
            pairs = self.train_examples()
            hf = self.spec.hf_enabled
            out = []
            for side, key in (("src", "train_src"), ("tgt", "train_tgt")):
                lines = [getattr(p, side) for p in pairs]
                if hf:
                    tok = bpe_tokenizer.train_tokenizer(
                        lines,
                        settings.get("kind", "bpe"),
                        settings.get(f"{side}_vocab_size", 8000),
                        settings.get("min_frequency", 2),
                        settings.get("lowercase", False),
                    )
                else:
                    source = resolve_file(self.data_dir, self.options[key], f"translation train {side}")
                    tok = bpe_tokenizer.cached_tokenizer(
                        self.cache_dir,
                        f"multi30k-{side}",
                        source,
                        lines,
                        kind=settings.get("kind", "bpe"),
                        vocab_size=settings.get(f"{side}_vocab_size", 8000),
                        min_frequency=settings.get("min_frequency", 2),
                        lowercase=settings.get("lowercase", False),
                    )
                out.append(tok)
            self._tokenizers = tuple(out)
        return self._tokenizers

    def encode(self, examples: Sequence[SentencePair]) -> list[dict]:
        src_tok, tgt_tok = self.tokenizers()
        keep = self.max_len - 1  # room for EOS / BOS
        src = src_tok.encode_batch([p.src for p in examples], add_special_tokens=False)
        tgt = tgt_tok.encode_batch([p.tgt for p in examples], add_special_tokens=False)
        return [{"src": s.ids[:keep] + [bpe_tokenizer.EOS_ID], "tgt": t.ids[:keep]} for s, t in zip(src, tgt)]

    def feature_length(self, feature: dict) -> int:
        return len(feature["src"]) + len(feature["tgt"])

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        src = [f["src"] for f in features]
        return {
            "input_ids": self.pad(src, bpe_tokenizer.PAD_ID),
            "attention_mask": self.attention_mask(src),
            "decoder_input_ids": self.pad([[bpe_tokenizer.BOS_ID] + f["tgt"] for f in features], bpe_tokenizer.PAD_ID),
            "labels": self.pad([f["tgt"] + [bpe_tokenizer.EOS_ID] for f in features], IGNORE_INDEX),
        }

    # ---- model and metric ----------------------------------------------------------------------
    def build_model(self, seed: int):
        src_tok, tgt_tok = self.tokenizers()
        torch.manual_seed(seed)
        return model_config.build_translation_model(
            self.model_spec,
            src_tok.get_vocab_size(),
            tgt_tok.get_vocab_size(),
            bpe_tokenizer.PAD_ID,
            label_smoothing=float(self.options.get("label_smoothing", 0.0)),
        )

    def predict_batch(self, model, hidden, batch, indices, beam_size):
        extra = int(self.options.get("decode_extra_len", 10))
        steps = min(self.max_len, int(batch["attention_mask"].sum(1).max()) + extra)
        bos, eos = bpe_tokenizer.BOS_ID, bpe_tokenizer.EOS_ID
        if beam_size <= 1:
            return model.head.greedy_decode(hidden, batch["attention_mask"], steps, bos, eos)
        return model.head.beam_decode(hidden, batch["attention_mask"], steps, bos, eos, beam_size)

    def detokenize(self, ids: Sequence[int]) -> str:
        return bpe_tokenizer.decode(self.tokenizers()[1], ids)

    def score(self, split, indices, predictions) -> dict[str, float]:
        examples = self.examples(split)
        hyps = [self.detokenize(ids) for ids in predictions]
        refs = [examples[i].tgt for i in indices]
        return {"bleu": corpus_bleu(hyps, refs, tokenize=self.options.get("bleu_tokenize", "13a"))}


TASK = TranslationTask
