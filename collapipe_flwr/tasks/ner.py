"""People's Daily Chinese NER with BERT token classification (paper Section VI.A, task ii).

File format (docs/data.md): ``char<SPACE>tag`` a line, a blank line ends a sentence; 7 BIO
tags over PER/LOC/ORG with BertWithPretrained's ids. Tokenisation is character-level: the characters of a
sentence go to BertTokenizerFast with ``is_split_into_words=True`` (a pretrained encoder's own tokenizer with
``model.hf_folder``, tasks/hf_encoder.py); each character's tag sits on its first token, [CLS]/[SEP]/padding
get -100. Sentences longer than max_len - 2 characters are cut (upstream
does the same); at evaluation the cut-off characters count as predicted ``O`` against the full gold
sentence, so the score is never flattered by the cut. Metric: entity-level P/R/F1 (seqeval).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks import hf_encoder, model_config
from collapipe_flwr.tasks.base import HUB_SPLITS, Task
from collapipe_flwr.tasks.batching import IGNORE_INDEX
from collapipe_flwr.tasks.bert_vocab import bert_tokenizer
from collapipe_flwr.tasks.data_files import text_lines
from collapipe_flwr.tasks.file_options import (
    REQUIRED_SPLIT_FILES,
    SPLIT_FILE_KEYS,
    read_file_split,
    require_file_list,
    require_file_options,
)
from collapipe_flwr.tasks.metrics import entity_scores
from collapipe_flwr.tasks.model_family import ModelFamily

LABELS = ("O", "B-ORG", "B-LOC", "B-PER", "I-ORG", "I-LOC", "I-PER")
LABEL_IDS = {tag: i for i, tag in enumerate(LABELS)}


@dataclass(frozen=True)
class TaggedSentence:
    chars: tuple[str, ...]
    tags: tuple[str, ...]


def _dominant_type(tags: Sequence[str]) -> str | None:
    """The entity type with the most tagged characters (ties: alphabetical first); None without entities."""
    counts = Counter(tag.split("-", 1)[1] for tag in tags if "-" in tag)
    return min(counts, key=lambda t: (-counts[t], t)) if counts else None


def read_bio(path) -> tuple[TaggedSentence, ...]:
    """Sentences of a ``char<SPACE>tag`` file; one-line DataFormatError naming file:line on a bad line."""
    sentences: list[TaggedSentence] = []
    chars: list[str] = []
    tags: list[str] = []
    for number, line in enumerate(text_lines(path), start=1):
        if not line.strip():
            if chars:
                sentences.append(TaggedSentence(tuple(chars), tuple(tags)))
                chars, tags = [], []
            continue
        char, sep, tag = line.rpartition(" ")
        if not sep or not char or not tag:
            raise DataFormatError(
                f"{path}:{number}: expected 'char<SPACE>tag' (tag one of {', '.join(LABELS)}), got {line!r}"
            )
        if tag not in LABEL_IDS:
            raise DataFormatError(f"{path}:{number}: unknown tag {tag!r}; expected one of {', '.join(LABELS)}")
        chars.append(char)
        tags.append(tag)
    if chars:
        sentences.append(TaggedSentence(tuple(chars), tuple(tags)))
    return tuple(sentences)


def align_labels(word_ids: Sequence[int | None], tags: Sequence[str]) -> list[int]:
    """Token labels: the tag id of each word on its first token, -100 on special and continuation tokens."""
    labels, previous = [], None
    for word in word_ids:
        if word is None or word == previous:
            labels.append(IGNORE_INDEX)
        else:
            labels.append(LABEL_IDS[tags[word]])
        previous = word
    return labels


def word_tags(word_ids: Sequence[int | None], token_tags: Sequence[int], num_words: int) -> list[str]:
    """Back from tokens to one tag per word (first token wins); words without a token get ``O``."""
    out = ["O"] * num_words
    seen = set()
    for word, tag in zip(word_ids, token_tags):
        if word is not None and word not in seen:
            seen.add(word)
            out[word] = LABELS[int(tag)]
    return out


class NerTask(Task):
    name = "ner"
    metric_name = "f1"
    model_family = ModelFamily.BERT
    hf_encoders = True  # or a pretrained BERT / RoBERTa folder (family hf, tasks/hf_encoder.py)
    task_keys = SPLIT_FILE_KEYS | {"crf"}

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        require_file_options(options, REQUIRED_SPLIT_FILES)
        require_file_list(options, example="[chinese_ner/supplementary_msra/msra_bio.txt]")
        if not isinstance(options.get("crf", False), bool):
            raise ConfigError(
                f"task.crf={options.get('crf')!r} must be true (CRF over the tags) or false (per-token softmax)"
            )

    def read_split(self, split: str) -> Sequence[TaggedSentence]:
        sizes: list[int] = []
        examples = read_file_split(self.data_dir, self.options, split, "NER", read_bio, sizes)
        if split == "train":
            self._corpus_sizes = sizes
        return examples

    def partition_labels(self) -> list[int]:
        """A sentence's label for the label-skewed partitions (a proxy: NER has no sentence label): the entity type
        with the most tagged characters in it (PER, LOC, ORG, ... by their B-/I- tags; a tie goes to the type first
        in alphabetical order), or "none" for a sentence without entities. Types are numbered alphabetically,
        "none" last."""
        dominant = [_dominant_type(s.tags) for s in self.train_examples()]
        types = sorted({t for t in dominant if t is not None})
        number = {t: i for i, t in enumerate(types)}
        return [number[t] if t is not None else len(types) for t in dominant]

    def read_hf_split(self, split: str, hf: Mapping[str, Any]) -> Sequence[TaggedSentence]:
        """e.g. ``hf_dataset: {enabled: true, id: peoples_daily_ner}`` (tokens + ner_tags ClassLabel)."""
        import datasets

        name = HUB_SPLITS[split]
        rows = datasets.load_dataset(hf.get("id", "peoples_daily_ner"), split=hf.get(f"{split}_split", name))
        names = rows.features["ner_tags"].feature.names
        return [TaggedSentence(tuple(r["tokens"]), tuple(names[t] for t in r["ner_tags"])) for r in rows]

    def tokenizer(self):
        """The bert-base-chinese vocab of ``vocab_file``, or a model folder's own tokenizer."""
        if hf_encoder.uses_folder(self.model_spec):
            return hf_encoder.folder_tokenizer(self.model_spec)
        return bert_tokenizer(self.data_dir, self.options["vocab_file"])

    def encode(self, examples: Sequence[TaggedSentence]) -> list[dict]:
        tok = self.tokenizer()
        try:
            enc = tok(
                [list(s.chars) for s in examples], is_split_into_words=True, truncation=True, max_length=self.max_len
            )
        except ValueError as err:  # a model folder's tokenizer that refuses pre-split words
            raise ConfigError(
                f"the tokenizer {type(tok).__name__} cannot take the sentences as lists of characters "
                f"({str(err).splitlines()[0][:120]}); NER needs one that does (a BERT folder's WordPiece vocab.txt)"
            ) from None
        out = []
        for i, sentence in enumerate(examples):
            words = enc.word_ids(i)
            labels = align_labels(words, sentence.tags)
            out.append({"input_ids": enc["input_ids"][i], "labels": labels, "word_ids": words})
        return out

    def feature_length(self, feature: dict) -> int:
        return len(feature["input_ids"])

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        ids = [f["input_ids"] for f in features]
        return {
            "input_ids": self.pad(ids, self.tokenizer().pad_token_id),
            "attention_mask": self.attention_mask(ids),
            "labels": self.pad([f["labels"] for f in features], IGNORE_INDEX),
        }

    def build_model(self, seed: int):
        torch.manual_seed(seed)
        head = "token_crf" if self.options.get("crf", False) else "token"
        if hf_encoder.uses_folder(self.model_spec):
            return hf_encoder.build_encoder_model(self.model_spec, len(self.tokenizer()), head, len(LABELS))
        return model_config.build_bert_model(self.model_spec, len(self.tokenizer()), head, len(LABELS))

    def predict_batch(self, model, hidden, batch, indices, beam_size):
        tags = model.head.predict(hidden, batch["attention_mask"], batch)
        return [tags[row].tolist() for row in range(len(indices))]

    def score(self, split, indices, predictions) -> dict[str, float]:
        examples, feats = self.examples(split), self.features_at(split, indices)
        gold, pred = [], []
        for i, token_tags in zip(indices, predictions):
            sentence = examples[i]
            gold.append(list(sentence.tags))
            pred.append(word_tags(feats[i]["word_ids"], token_tags, len(sentence.chars)))
        return entity_scores(gold, pred)


TASK = NerTask
