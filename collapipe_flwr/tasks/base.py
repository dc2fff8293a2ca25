"""What every task offers the rest of the system (issue 5; docs/contracts.md "Batches").

A :class:`Task` owns how to read its files, its tokenizer, its collate function, the server-side part
of its model (through collapipe_flwr.models builders), its loss and its metric. Subclasses supply
``read_split`` (parsing), ``encode`` (tokenisation to plain lists), ``collate`` (lists -> batch dict),
``build_model`` and ``score`` (metric over a split). Everything else (caching, partitioning D_n,
batching b, evaluation loop) lives here once.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from collapipe_flwr.accelerator import batch_to, module_device
from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks import batching, domain_validation
from collapipe_flwr.tasks.model_family import ModelFamily
from collapipe_flwr.tasks.partition import Partition, Skew, partition_indices

if TYPE_CHECKING:  # spec.py imports the registry, which imports this module
    from collapipe_flwr.tasks.spec import ModelSpec, TaskSpec

CACHE_ENV = "COLLAPIPE_CACHE_DIR"
SPLITS = ("train", "val", "test")
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}  # each split's name on the Hugging Face Hub


def resolve_cache_dir(value: str | os.PathLike | None) -> Path:
    """``value``, else $COLLAPIPE_CACHE_DIR, else ~/.cache/collapipe_flwr."""
    text = str(value or "") or os.environ.get(CACHE_ENV, "") or str(Path.home() / ".cache" / "collapipe_flwr")
    return Path(text).expanduser()


class Task(ABC):
    """One of the paper's tasks on real files, configured by conf/task/<name>.yaml and conf/model/<name>.yaml
    (parsed once into ``spec`` and ``model_spec`` by :mod:`collapipe_flwr.tasks.spec`)."""

    name: ClassVar[str]
    metric_name: ClassVar[str]  # "bleu" | "f1" | "accuracy"
    model_family: ClassVar[ModelFamily]
    # the task also runs a pretrained Hugging Face encoder (family hf, model_type bert | roberta, model.hf_folder):
    # tasks/hf_encoder.py, docs/hf_bert_tasks.md
    hf_encoders: ClassVar[bool] = False
    task_keys: ClassVar[frozenset[str]] = frozenset()  # the keys of TaskSpec.options this task accepts

    def __init__(
        self,
        task: TaskSpec,
        model: ModelSpec,
        data_dir: Path | str,
        seed: int,
        cache_dir: Path | None = None,
    ) -> None:
        if task.name != self.name or not self.runs_family(model.family):
            raise ConfigError(
                f"task {self.name} needs task.name={self.name} and a {self.model_family} model, "
                f"got task.name={task.name} and model.family={model.family}"
            )
        self.spec = task
        self.model_spec = model
        self.data_dir = Path(data_dir)
        self.seed = int(seed)
        self.cache_dir = resolve_cache_dir(cache_dir or task.cache_dir)
        self._examples: dict[str, tuple] = {}
        self._features: dict[str, dict[int, dict]] = {}  # split -> {example index: its encoding}, filled on demand
        self._corpus_sizes: list[int] = []  # examples per training corpus, set by read_split (domain partition)

    # ---- configuration -------------------------------------------------------------------------
    @classmethod
    def runs_family(cls, family: str) -> bool:
        """Whether a model of ``family`` can run this task: its own, or ``hf`` for a task that runs HF encoders."""
        return family == cls.model_family or (family == ModelFamily.HF and cls.hf_encoders)

    @classmethod  # noqa: B027 - an optional hook, a no-op unless a task overrides it
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check the task-specific keys (file names, tokenizer settings); one-line ConfigError naming the key.
        Unknown keys are already refused by :func:`~collapipe_flwr.tasks.spec.parse_task`. An optional hook:
        the base accepts every option."""

    @property
    def options(self) -> Mapping[str, Any]:
        """The task-specific keys of the task config (``task_keys``)."""
        return self.spec.options

    @property
    def batch_size(self) -> int:
        """b of the paper (Table II: 64)."""
        return self.spec.batch_size

    @property
    def max_len(self) -> int:
        return self.spec.max_len

    def pad(self, sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
        """``sequences`` as a [B, T] tensor padded with ``value``, T rounded up to ``task.pad_multiple`` within
        max_len (:func:`~collapipe_flwr.tasks.batching.pad`)."""
        return batching.pad(sequences, value, self.spec.pad_multiple, self.max_len)

    def attention_mask(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """The [B, T] mask of :meth:`pad`'s tensor: 1 on real tokens, 0 on padding."""
        return batching.attention_mask(sequences, self.spec.pad_multiple, self.max_len)

    # ---- data ----------------------------------------------------------------------------------
    def train_examples(self) -> tuple:
        return self._split_examples("train")

    def val_examples(self) -> tuple:
        return self._split_examples("val")

    def test_examples(self) -> tuple:
        """The test split: only from files a user names explicitly (task.test_*); never during tuning."""
        return self._split_examples("test")

    def _split_examples(self, split: str) -> tuple:
        if split not in self._examples:
            if domain_validation.SPLIT.fullmatch(split):
                return self._domain_validation(split)
            if self.spec.hf_enabled:
                self._examples[split] = tuple(self.read_hf_split(split, self.spec.hf_dataset))
            else:
                self._examples[split] = tuple(self.read_split(split))
            if not self._examples[split]:
                raise DataFormatError(f"the {self.name} {split} split has no examples; check the task's {split} files")
            if split == "train" and self.spec.partition is Partition.DOMAIN and len(self._corpus_sizes) > 1:
                train, self._corpus_sizes, held = domain_validation.hold_out(self._examples[split], self._corpus_sizes)
                self._examples[split] = tuple(train)
                self._examples.update({name: tuple(examples) for name, examples in held.items()})
        return self._examples[split]

    def _domain_validation(self, split: str) -> tuple:
        """A domain's held-out validation examples (tasks/domain_validation.py), read with the training split."""
        self._split_examples("train")
        if split not in self._examples:
            raise ConfigError(
                f"split {split!r} exists only with task.partition=domain and that many task.extra_train_files; "
                f"this run has {len(self._corpus_sizes) - 1}"
            )
        return self._examples[split]

    def domain_validation_splits(self) -> list[str]:
        """``val_domain<d>`` of each extra training corpus under ``task.partition: domain`` (else none)."""
        if self.spec.partition is not Partition.DOMAIN:
            return []
        self._split_examples("train")
        return sorted((s for s in self._examples if domain_validation.SPLIT.fullmatch(s)), key=lambda s: int(s[10:]))

    def examples(self, split: str) -> tuple:
        if split not in SPLITS and not domain_validation.SPLIT.fullmatch(split):
            raise ConfigError(f"split {split!r} is not one of {', '.join(SPLITS)} (or val_domain<d>)")
        return self._split_examples(split)

    def features(self, split: str) -> list[dict]:
        """Every encoded example of ``split``, in order (:meth:`features_at` of all of them)."""
        done = self.features_at(split, range(len(self.examples(split))))
        return [done[i] for i in range(len(done))]

    def features_at(self, split: str, indices: Iterable[int]) -> Mapping[int, dict]:
        """The encoded examples of ``split`` at ``indices``, as {index: encoding}.

        Encoded on demand and kept per Task: only the indices not encoded yet are tokenised, in one batched call,
        so a CU encodes its own partition D_n and an evaluation its first ``max_examples``, not the whole split.
        Every task's :meth:`encode` treats each example on its own (padding is :meth:`collate`'s), so an
        example's encoding does not depend on which others are encoded with it. The mapping returned is the
        split's cache: it holds at least ``indices``."""
        done = self._features.setdefault(split, {})
        examples = self.examples(split)
        missing = sorted({int(i) for i in indices} - done.keys())
        if missing:
            done.update(zip(missing, self.encode([examples[i] for i in missing]), strict=True))
        return done

    @abstractmethod
    def read_split(self, split: str) -> Sequence:
        """Parse the configured files of ``split`` (one-line DataFormatError on bad lines)."""

    def read_hf_split(self, split: str, hf: Mapping[str, Any]) -> Sequence:
        """The same examples from a Hugging Face dataset id (online alternative, off by default)."""
        raise ConfigError(f"task {self.name} has no Hugging Face alternative; set task.hf_dataset.enabled=false")

    @abstractmethod
    def encode(self, examples: Sequence) -> list[dict]:
        """Tokenise ``examples`` to plain lists (one dict per example)."""

    @abstractmethod
    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        """Pad a list of encoded examples into a batch dict (docs/contracts.md "Batches")."""

    def feature_length(self, feature: dict) -> int | None:
        """An encoded example's token length, for length bucketing (``task.bucket``; None: no bucketing)."""
        return None

    def partition_labels(self) -> list[int] | None:
        """Per-train-example labels of the label-skewed partitions (dirichlet, pathological) and of the partition
        histograms in rounds.jsonl (None: the task has no sentence label)."""
        return None

    def domain_labels(self) -> list[int] | None:
        """Per-train-example corpus (0 = ``train_file``, 1.. = each of ``extra_train_files``): the domains of
        ``task.partition: domain`` (None: the task reads one corpus)."""
        self.train_examples()
        sizes = self._corpus_sizes
        return [c for c, n in enumerate(sizes) for _ in range(n)] if len(sizes) > 1 else None

    # ---- federation ----------------------------------------------------------------------------
    def partition(self, num_partitions: int, partition_id: int) -> list[int]:
        """Indices into train_examples() that CU ``partition_id`` of N reads (D_n); seeded by the task seed."""
        scheme = self.spec.partition
        labels = None
        if scheme.by_label:
            labels = self.partition_labels()
            if labels is None:
                raise ConfigError(
                    f"task.partition={scheme} needs sentence labels; task {self.name} has none, use partition=iid "
                    "or quantity"
                )
        elif scheme is Partition.DOMAIN:
            labels = self.domain_labels()
            if labels is None:
                raise ConfigError(
                    f"task.partition=domain needs two or more training corpora; task {self.name} reads one "
                    "(name the others in task.extra_train_files)"
                )
        return partition_indices(
            len(self.train_examples()),
            num_partitions,
            partition_id,
            seed=self.seed,
            scheme=scheme,
            labels=labels,
            skew=Skew(
                alpha=self.spec.alpha,
                quantity=self.spec.quantity,
                classes_per_partition=self.spec.classes_per_partition,
            ),
        )

    def batches(
        self,
        indices: Sequence[int],
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        split: str = "train",
    ) -> Iterator[dict[str, torch.Tensor]]:
        """One pass over ``indices`` of ``split`` in batches of ``batch_size`` (b), shuffled by ``seed``."""
        size = len(self.examples(split))
        bad = [i for i in indices if not 0 <= int(i) < size]
        if bad:
            raise ConfigError(f"example index {bad[0]} is out of range for the {size} {split} examples")
        feats = self.features_at(split, indices)
        bucketing = None
        if shuffle and self.spec.bucket > 1:  # batch_order sorts by length only then
            lengths = {int(i): self.feature_length(feats[int(i)]) for i in indices}
            bucketing = None if None in lengths.values() else cast("dict[int, int]", lengths)  # None: no lengths
        order = batching.batch_order(indices, batch_size, seed, shuffle, drop_last, bucketing, self.spec.bucket)
        for batch in order:
            yield self.collate([feats[i] for i in batch])

    # ---- model and evaluation ------------------------------------------------------------------
    @abstractmethod
    def build_model(self, seed: int):
        """A fresh SplitModel for this task (random init seeded by ``seed``; sizes from the model config)."""

    @torch.no_grad()
    def evaluate(
        self, model, max_examples: int = 0, batch_size: int = 64, beam_size: int = 1, split: str = "val"
    ) -> dict[str, float]:
        """Loss and the task metric on the validation split (``split="test"`` only when asked)."""
        n = len(self.examples(split))
        indices = list(range(n if not max_examples else min(n, int(max_examples))))
        parts = [model.embedding, model.blocks, model.head]
        modes = [p.training for p in parts]
        for p in parts:
            p.eval()
        try:
            loss_sum, count, outputs = 0.0, 0, []
            feats = self.features_at(split, indices)
            for start in range(0, len(indices), batch_size):
                chunk = indices[start : start + batch_size]
                batch = batch_to(self.collate([feats[i] for i in chunk]), module_device(model.embedding))
                hidden = model.encode(batch["input_ids"], batch["attention_mask"])
                s, c = model.head.loss_terms(hidden, batch["attention_mask"], batch)
                loss_sum += float(s)
                count += int(c)
                outputs.extend(self.predict_batch(model, hidden, batch, chunk, beam_size))
        finally:
            for p, mode in zip(parts, modes):
                p.train(mode)
        metrics = self.score(split, indices, outputs)
        metrics["loss"] = loss_sum / max(count, 1)
        metrics["examples"] = float(len(indices))
        return metrics

    @abstractmethod
    def predict_batch(self, model, hidden: torch.Tensor, batch: dict, indices: Sequence[int], beam_size: int) -> list:
        """Per-example predictions of one evaluation batch."""

    @abstractmethod
    def score(self, split: str, indices: Sequence[int], predictions: Sequence) -> dict[str, float]:
        """The task metric (key ``metric_name``) and companions for ``predictions`` of ``indices``."""
