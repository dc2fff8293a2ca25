"""Toutiao 15-class news-title classification with BERT (paper Section VI.A, task iii).

File format (docs/data.md): ``title_!_labelid`` a line, label ids 0..14 (BertWithPretrained's
``label_map`` of the original codes 100..116). Titles are tokenised by BertTokenizerFast over the
bert-base-chinese vocab and cut at max_len tokens ([CLS] ... [SEP]); with a pretrained Hugging Face encoder
(``model.hf_folder``, tasks/hf_encoder.py) by the folder's own tokenizer. Batches: ``labels`` [B].
Metrics: accuracy and macro-F1. Partitions may be label-skewed (Dirichlet over ``labels``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks import hf_encoder, model_config
from collapipe_flwr.tasks.base import HUB_SPLITS, Task
from collapipe_flwr.tasks.bert_vocab import bert_tokenizer
from collapipe_flwr.tasks.data_files import text_lines
from collapipe_flwr.tasks.file_options import (
    REQUIRED_SPLIT_FILES,
    SPLIT_FILE_KEYS,
    read_file_split,
    require_file_list,
    require_file_options,
)
from collapipe_flwr.tasks.metrics import classification_scores
from collapipe_flwr.tasks.model_family import ModelFamily

SEPARATOR = "_!_"
CLASS_NAMES = (
    "news_story",
    "news_culture",
    "news_entertainment",
    "news_sports",
    "news_finance",
    "news_house",
    "news_car",
    "news_edu",
    "news_tech",
    "news_military",
    "news_travel",
    "news_world",
    "stock",
    "news_agriculture",
    "news_game",
)
TOUTIAO_CODES = (100, 101, 102, 103, 104, 106, 107, 108, 109, 110, 112, 113, 114, 115, 116)


@dataclass(frozen=True)
class Title:
    text: str
    label: int


def read_titles(path, num_labels: int = len(CLASS_NAMES)) -> tuple[Title, ...]:
    """Labelled titles of a ``title_!_labelid`` file (blank lines skipped); DataFormatError names file:line."""
    titles = []
    for number, line in enumerate(text_lines(path), start=1):
        if not line.strip():
            continue
        text, sep, label = line.rpartition(SEPARATOR)
        if not sep:
            raise DataFormatError(
                f"{path}:{number}: no '{SEPARATOR}' separator; expected 'title{SEPARATOR}labelid', got {line[:60]!r}"
            )
        label = label.strip()
        if not label.isdigit() or not 0 <= int(label) < num_labels:
            raise DataFormatError(
                f"{path}:{number}: unknown label id {label!r}; "
                f"expected an integer 0..{num_labels - 1} after '{SEPARATOR}'"
            )
        if not text.strip():
            raise DataFormatError(f"{path}:{number}: empty title; expected 'title{SEPARATOR}labelid'")
        titles.append(Title(text.strip(), int(label)))
    return tuple(titles)


class ClassificationTask(Task):
    name = "classification"
    metric_name = "accuracy"
    model_family = ModelFamily.BERT
    hf_encoders = True  # or a pretrained BERT / RoBERTa folder (family hf, tasks/hf_encoder.py)
    task_keys = SPLIT_FILE_KEYS | {"num_labels"}

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        require_file_options(options, REQUIRED_SPLIT_FILES)
        n = options.get("num_labels", len(CLASS_NAMES))
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ConfigError(f"task.num_labels={n!r} must be an integer >= 2")
        require_file_list(options)

    @property
    def num_labels(self) -> int:
        return int(self.options.get("num_labels", len(CLASS_NAMES)))

    def read_split(self, split: str) -> Sequence[Title]:
        sizes: list[int] = []
        examples = read_file_split(
            self.data_dir, self.options, split, "Toutiao", partial(read_titles, num_labels=self.num_labels), sizes
        )
        if split == "train":
            self._corpus_sizes = sizes
        return examples

    def read_hf_split(self, split: str, hf: Mapping[str, Any]) -> Sequence[Title]:
        """e.g. ``hf_dataset: {enabled: true, id: clue/clue, subset: tnews}``: TNEWS labels are the Toutiao
        codes ("100".."116"), mapped here to ids 0..14 (its test split is unlabelled)."""
        import datasets

        name = HUB_SPLITS[split]
        rows = datasets.load_dataset(
            hf.get("id", "clue/clue"), hf.get("subset", "tnews"), split=hf.get(f"{split}_split", name)
        )
        names = rows.features["label"].names
        code_to_id = {code: i for i, code in enumerate(TOUTIAO_CODES)}
        return [Title(r["sentence"], code_to_id[int(names[r["label"]])]) for r in rows if r["label"] >= 0]

    def tokenizer(self):
        """The bert-base-chinese vocab of ``vocab_file``, or a model folder's own tokenizer."""
        if hf_encoder.uses_folder(self.model_spec):
            return hf_encoder.folder_tokenizer(self.model_spec)
        return bert_tokenizer(self.data_dir, self.options["vocab_file"])

    def encode(self, examples: Sequence[Title]) -> list[dict]:
        enc = self.tokenizer()([t.text for t in examples], truncation=True, max_length=self.max_len)
        return [{"input_ids": ids, "label": t.label} for ids, t in zip(enc["input_ids"], examples)]

    def feature_length(self, feature: dict) -> int:
        return len(feature["input_ids"])

    def partition_labels(self) -> list[int]:
        return [t.label for t in self.train_examples()]

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        ids = [f["input_ids"] for f in features]
        return {
            "input_ids": self.pad(ids, self.tokenizer().pad_token_id),
            "attention_mask": self.attention_mask(ids),
            "labels": torch.tensor([f["label"] for f in features], dtype=torch.long),
        }

    def build_model(self, seed: int):
        torch.manual_seed(seed)
        if hf_encoder.uses_folder(self.model_spec):
            return hf_encoder.build_encoder_model(self.model_spec, len(self.tokenizer()), "sequence", self.num_labels)
        return model_config.build_bert_model(self.model_spec, len(self.tokenizer()), "sequence", self.num_labels)

    def predict_batch(self, model, hidden, batch, indices, beam_size):
        return model.head.predict(hidden, batch["attention_mask"], batch).tolist()

    def score(self, split, indices, predictions) -> dict[str, float]:
        examples = self.examples(split)
        return classification_scores([examples[i].label for i in indices], [int(p) for p in predictions])


TASK = ClassificationTask
