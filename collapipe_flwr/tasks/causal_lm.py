"""Next-token prediction with a Hugging Face decoder-only model (GPT-2, Llama, Qwen2, Mistral); metric perplexity.

Data: one text a line (by default the English side of Multi30K, ``multi30k/tok/*.lc.norm.tok.en``). A line
becomes [BOS] + its tokens + [EOS], cut to ``task.max_len`` tokens. Batches (docs/contracts.md):
``input_ids`` padded with the tokenizer's pad id, ``attention_mask``, ``labels`` = the input ids with -100
at padding; the server's head (norm + LM head, models/hf/causal_lm_head.py) shifts them, so position t
predicts token t + 1 and every token after BOS, EOS included, is a target.

``task.format: translation`` (tasks/lm_translation.py) reads aligned source / target files instead and writes a
pair as ``[BOS] + "English: <source>\nGerman:" + " <target>" + [EOS]`` (``task.chat_template: true``: in the
tokenizer's chat template; models/hf/prompting.py); the prompt's labels are -100, so only the target's tokens
are targets, and the validation adds ``bleu`` (greedy translations of a fixed subset, sacrebleu).

Model: the model folder's own (``model.hf_folder``) with its own tokenizer, or a from-scratch model built
from ``model.model_type`` and sizes with a byte-level BPE trained on the training file (tasks/hf_tokenizer.py).
The CU runs the embedding, the devices the L TEBs in segments delta_k, the server the norm + LM head.

Metric: perplexity = exp(mean next-token negative log-likelihood over the split's targets), i.e. exp of the
``loss`` every task reports (lower is better); ``token_accuracy`` (argmax next token) accompanies it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from collapipe_flwr.errors import DataFormatError
from collapipe_flwr.models.hf.prompting import FormatKind
from collapipe_flwr.tasks import hf_tokenizer, lm_translation, model_config
from collapipe_flwr.tasks.base import Task
from collapipe_flwr.tasks.batching import IGNORE_INDEX
from collapipe_flwr.tasks.data_files import resolve_file, text_lines
from collapipe_flwr.tasks.file_options import require_file_options, require_test_files
from collapipe_flwr.tasks.model_family import ModelFamily


def read_text(path) -> tuple[str, ...]:
    """The non-empty lines of ``path``, whitespace normalised (one text a line)."""
    lines = tuple(" ".join(line.split()) for line in text_lines(path))
    kept = tuple(line for line in lines if line)
    if not kept:
        raise DataFormatError(f"{path} holds no text; give a file with one text a line")
    return kept


class CausalLMTask(Task):
    name = "causal_lm"
    metric_name = "perplexity"
    model_family = ModelFamily.HF
    task_keys = frozenset(
        {"train_file", "val_file", "test_file", "tokenizer", "format", "chat_template", "translation"}
    )

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        require_file_options(options, ("train_file", "val_file"), noun="text file (one text a line)")
        hf_tokenizer.check_settings(options.get("tokenizer"))
        lm_translation.prompt_format(options)  # format, chat_template and translation, typed once

    @property
    def format(self):
        """How an example is written (models/hf/prompting.py): plain text, or a translation pair."""
        return lm_translation.prompt_format(self.options)

    @property
    def translating(self) -> bool:
        return self.format.kind is FormatKind.TRANSLATION

    # ---- data ----------------------------------------------------------------------------------
    def _file(self, split: str):
        require_test_files(split, self.options, ("test_file",))
        return resolve_file(self.data_dir, self.options.get(f"{split}_file") or "", f"causal_lm {split} text")

    def read_split(self, split: str) -> Sequence:
        if self.translating:
            return lm_translation.read_pairs(self.data_dir, self.options, split)
        return read_text(self._file(split))

    def partition_labels(self) -> list[int]:
        """A text's label for the label-skewed partitions (a proxy, as translation's): the quartile of its length in
        words over the training split (0 = shortest quarter .. 3 = longest)."""
        import numpy as np

        translating = self.translating
        texts = [e.src if translating else e for e in self.train_examples()]
        lengths = np.array([len(text.split()) for text in texts])
        edges = np.quantile(lengths, [0.25, 0.5, 0.75])
        return [int(q) for q in np.searchsorted(edges, lengths, side="right")]

    def tokenizer(self):
        """The model folder's tokenizer, else the byte-level BPE trained on the training file (cached)."""
        if not hasattr(self, "_tokenizer"):
            hf = self.model_spec.hf
            if hf is not None and hf.from_folder:
                self._tokenizer = hf_tokenizer.folder_tokenizer(hf.hf_folder, hf.allow_hub, hf.gguf_file)
            else:
                settings = hf_tokenizer.check_settings(self.options.get("tokenizer"))
                lines, sources = self.train_examples(), [self._file("train")]
                if self.translating:  # both sides of the pairs
                    lines = tuple(text for pair in lines for text in (pair.src, pair.tgt))
                    sources = lm_translation.train_files(self.data_dir, self.options)
                self._tokenizer = hf_tokenizer.cached_byte_bpe(self.cache_dir, sources, lines, settings)
        return self._tokenizer

    def special_ids(self) -> dict[str, int]:
        return hf_tokenizer.special_ids(self.tokenizer())

    def encode(self, examples: Sequence) -> list[dict]:
        if self.translating:  # prompt + target, cut to max_len; the prompt is no target
            fmt, tokenizer, out = self.format, self.tokenizer(), []
            for pair in examples:
                prompt, target = fmt.example_ids(tokenizer, pair.src, pair.tgt)
                row = [*prompt, *target][: self.max_len]
                out.append({"ids": row, "labels": ([IGNORE_INDEX] * len(prompt) + target)[: self.max_len]})
            return out
        ids = self.special_ids()
        keep = self.max_len - 2  # room for BOS and EOS
        encoded = self.tokenizer()(list(examples), add_special_tokens=False)["input_ids"]
        return [{"ids": [ids["bos_token_id"], *tokens[:keep], ids["eos_token_id"]]} for tokens in encoded]

    def feature_length(self, feature: dict) -> int:
        return len(feature["ids"])

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        seqs = [f["ids"] for f in features]
        return {
            "input_ids": self.pad(seqs, self.special_ids()["pad_token_id"]),
            "attention_mask": self.attention_mask(seqs),
            "labels": self.pad([f.get("labels", f["ids"]) for f in features], IGNORE_INDEX),
        }

    # ---- model and metric ----------------------------------------------------------------------
    def build_model(self, seed: int):
        torch.manual_seed(seed)
        return model_config.build_causal_lm(self.model_spec, len(self.tokenizer()), self.special_ids())

    def predict_batch(self, model, hidden, batch, indices, beam_size) -> list[tuple[int, int]]:
        """(correct argmax next tokens, targets) per example."""
        targets = batch["labels"][:, 1:]
        hit = (model.head.predict(hidden, batch["attention_mask"])[:, :-1] == targets) & (targets != IGNORE_INDEX)
        counts = (targets != IGNORE_INDEX).sum(1)
        return [(int(h), int(c)) for h, c in zip(hit.sum(1), counts)]

    def score(self, split, indices, predictions) -> dict[str, float]:
        correct = sum(c for c, _ in predictions)
        total = sum(n for _, n in predictions)
        return {"token_accuracy": correct / max(total, 1)}

    @torch.no_grad()
    def evaluate(self, model, max_examples=0, batch_size=64, beam_size=1, split="val") -> dict[str, float]:
        """The base evaluation, plus perplexity = exp(mean next-token NLL) (the base's ``loss``; of the targets alone
        under ``task.format: translation``, which adds ``bleu``: tasks/lm_translation.py)."""
        metrics = super().evaluate(model, max_examples, batch_size, beam_size, split)
        metrics["perplexity"] = math.exp(min(metrics["loss"], 700.0))  # exp overflows past ~709
        if self.translating and split in ("val", "test"):
            metrics.update(lm_translation.bleu_of(model, self.tokenizer(), self.examples(split), self.options))
        return metrics


TASK = CausalLMTask
