"""The ``task`` and ``model`` config sections (conf/task/<name>.yaml, conf/model/<name>.yaml) as typed specs.

:func:`parse_task` checks the keys every task has (batch size b, max_len, partition of D_n, ...) and lets
the task's class check its own ``options`` (file names, tokenizer settings). :func:`parse_model` checks the
model against the task it must run (family, sizes, positions >= task.max_len + 1), its optimizer and
its learning-rate schedule. Both raise one-line ConfigErrors naming the key; ``spec.to_raw()`` gives the
YAML shape back, so ``parse(spec.to_raw()) == spec``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.fast_dropout import DropoutKernel
from collapipe_flwr.models.hf_arch import CAUSAL_LM_TYPES, ENCODER_TYPES
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.spec_parsing import choice, mapping, require
from collapipe_flwr.tasks.hf_spec import HF_KEYS, HfSpec, parse_hf
from collapipe_flwr.tasks.lr_schedule import LrScheduleSpec, parse_lr_schedule
from collapipe_flwr.tasks.model_family import ModelFamily
from collapipe_flwr.tasks.partition import Partition, QuantityShape
from collapipe_flwr.tasks.registry import task_class

__all__ = [
    "COMMON_TASK_KEYS",
    "FAMILIES",
    "SIZE_KEYS",
    "LrScheduleSpec",
    "ModelSpec",
    "TaskSpec",
    "parse_lr_schedule",
    "parse_model",
    "parse_optimizer",
    "parse_task",
]

# The sizes of each model family (positions are ModelSpec.max_len); the hidden width is the first key.
SIZE_KEYS: dict[ModelFamily, tuple[str, ...]] = {
    ModelFamily.TRANSFORMER: ("d_model", "n_heads", "d_ff", "enc_layers", "dec_layers"),
    ModelFamily.BERT: ("hidden", "n_heads", "d_ff", "layers"),
    ModelFamily.HF: ("hidden", "n_heads", "d_ff", "layers"),  # a Hugging Face causal LM or encoder (tasks/hf_spec.py)
}
DEFAULT_MODELS = {
    ModelFamily.TRANSFORMER: "transformer_small",
    ModelFamily.BERT: "bert_small",
    ModelFamily.HF: "gpt2_tiny",
}
FAMILIES = tuple(SIZE_KEYS)
_MODEL_KEYS = (
    "description",
    "dropout",
    "dropout_kernel",
    "family",
    "lr_schedule",
    "max_len",
    "name",
    "optimizer",
    "pretrained_dir",
    "tie_embeddings",
)
_OPTIMIZER_KEYS = "name, lr, weight_decay, betas, momentum"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ----------------------------------------------------------------------------- task
@dataclass(frozen=True)
class TaskSpec:
    """``task``: what every task has; ``options`` holds the task-specific keys (checked by the Task class's
    ``validate_options``). ``batch_size`` is b (paper Table II: 64); ``partition`` (with ``alpha``, ``quantity``,
    ``classes_per_partition``: tasks/partition.py) splits the
    training set into the clusters' D_n; ``bucket`` sorts windows of bucket * b examples by length; ``pad_multiple``
    rounds each batch's width up to a multiple of it (tasks/batching.py: bounded shapes, bounded device memory)."""

    name: str
    batch_size: int
    max_len: int
    default_model: str = ""
    bucket: int = 0
    pad_multiple: int = 8
    partition: Partition = Partition.IID
    alpha: float = 0.5
    quantity: QuantityShape = QuantityShape.LINEAR
    classes_per_partition: int = 2
    cache_dir: str = ""
    hf_dataset: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, least in (("batch_size", 1), ("max_len", 4)):
            value = getattr(self, key)
            require(_is_int(value) and value >= least, f"task.{key}={value!r} must be an integer >= {least}")
        object.__setattr__(self, "partition", choice("task.partition", self.partition, Partition))
        require(
            _is_number(self.alpha) and self.alpha > 0,
            f"task.alpha={self.alpha!r} must be a number > 0 (Dirichlet concentration)",
        )
        object.__setattr__(self, "quantity", choice("task.quantity", self.quantity, QuantityShape))
        require(
            _is_int(self.classes_per_partition) and self.classes_per_partition >= 1,
            f"task.classes_per_partition={self.classes_per_partition!r} must be an integer >= 1 "
            "(partition: pathological)",
        )
        require(
            _is_int(self.bucket) and self.bucket >= 0,
            f"task.bucket={self.bucket!r} must be an integer >= 0 (0 = no length bucketing)",
        )
        require(
            _is_int(self.pad_multiple) and self.pad_multiple >= 1,
            f"task.pad_multiple={self.pad_multiple!r} must be an integer >= 1 (1 = pad to the longest sequence only)",
        )
        require(isinstance(self.hf_dataset, Mapping), "task.hf_dataset must be a mapping {enabled, id, ...}")
        require(
            self.partition is not Partition.DOMAIN or bool(dict(self.options).get("extra_train_files")),
            "task.partition=domain needs a second training corpus: name its file(s) in task.extra_train_files "
            "(docs/partitions.md)",
        )
        require(isinstance(self.options, Mapping), "task options must be a mapping")
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "hf_dataset", copy.deepcopy(dict(self.hf_dataset)))
        object.__setattr__(self, "options", copy.deepcopy(dict(self.options)))

    @property
    def hf_enabled(self) -> bool:
        """Whether the examples come from the Hugging Face dataset ``hf_dataset.id`` instead of the files."""
        return bool(self.hf_dataset.get("enabled"))

    def to_raw(self) -> dict[str, Any]:
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        return copy.deepcopy({**raw, **self.options})


COMMON_TASK_KEYS = tuple(f.name for f in dataclasses.fields(TaskSpec) if f.name != "options")


def parse_task(raw: Any) -> TaskSpec:
    """The ``task`` section as a TaskSpec; the task's class checks the task-specific keys."""
    require(isinstance(raw, Mapping), "config group task is missing; add task=<name> (see conf/task)")
    cls = task_class(raw.get("name"))
    allowed = set(COMMON_TASK_KEYS) | set(cls.task_keys)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        valid = ", ".join(sorted(allowed))
        raise ConfigError(f"unknown config key task.{unknown[0]}; valid keys of task {cls.name} are {valid}")
    common = {k: raw[k] for k in COMMON_TASK_KEYS if k in raw}
    common.update(batch_size=raw.get("batch_size"), max_len=raw.get("max_len"))
    for key in ("default_model", "cache_dir"):
        common[key] = str(raw.get(key) or "")
    common["hf_dataset"] = raw.get("hf_dataset") or {}
    options = {k: v for k, v in raw.items() if k not in COMMON_TASK_KEYS}
    spec = TaskSpec(**common, options=options)
    cls.validate_options(spec.options)
    return spec


# ----------------------------------------------------------------------------- model
def parse_optimizer(raw: Any) -> OptimizerSpec:
    """``model.optimizer`` (Adam, lr 1e-3 when absent) as the OptimizerSpec every part of the model uses."""
    raw = mapping("model.optimizer", raw)
    try:
        return OptimizerSpec.from_dict(raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"bad model.optimizer {raw}: {err}; valid keys are {_OPTIMIZER_KEYS}") from None


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """``model``: the family (transformer | bert | hf) and its sizes (:data:`SIZE_KEYS`), dropout and the kernel
    that draws its masks (``dropout_kernel``: ``fast``, models/fast_dropout.py, or ``torch`` to repeat a run made
    before it), positions ``max_len``, the optimizer every part uses and the learning-rate warm-up + decay over the
    run; ``hf`` holds a Hugging Face model's type, folder and LoRA settings (family hf only)."""

    name: str = ""
    family: ModelFamily
    description: str = ""
    sizes: Mapping[str, int]
    dropout: float = 0.1
    dropout_kernel: DropoutKernel = DropoutKernel.FAST
    max_len: int
    tie_embeddings: bool = False
    pretrained_dir: str = ""
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    lr_schedule: LrScheduleSpec = field(default_factory=LrScheduleSpec)
    hf: HfSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", choice("model.family", self.family, ModelFamily))
        require(
            (self.hf is not None) == (self.family is ModelFamily.HF),
            "model.model_type / hf_folder / lora belong to a family: hf model only",
        )
        require(
            isinstance(self.sizes, Mapping) and set(self.sizes) == set(SIZE_KEYS[self.family]),
            f"a {self.family} model has the sizes {', '.join(SIZE_KEYS[self.family])}",
        )
        for key, value in (*((k, self.sizes[k]) for k in SIZE_KEYS[self.family]), ("max_len", self.max_len)):
            require(_is_int(value) and value >= 1, f"model.{key}={value!r} must be an integer >= 1")
        require(
            _is_number(self.dropout) and 0 <= self.dropout < 1,
            f"model.dropout={self.dropout!r} must be a number in [0, 1)",
        )
        object.__setattr__(self, "dropout_kernel", choice("model.dropout_kernel", self.dropout_kernel, DropoutKernel))
        require(
            isinstance(self.tie_embeddings, bool), f"model.tie_embeddings={self.tie_embeddings!r} must be true or false"
        )
        require(
            self.width % self.sizes["n_heads"] == 0,
            f"model.n_heads={self.sizes['n_heads']} must divide the hidden size {self.width}",
        )
        object.__setattr__(self, "dropout", float(self.dropout))
        object.__setattr__(self, "sizes", {k: self.sizes[k] for k in SIZE_KEYS[self.family]})

    @property
    def width(self) -> int:
        """The hidden size (d_model of the Transformer, hidden of BERT)."""
        return self.sizes[SIZE_KEYS[self.family][0]]

    @property
    def encoder_blocks(self) -> int:
        """L, the blocks split over a cluster's devices (the Transformer's enc_layers; the layers of BERT or a
        Hugging Face model)."""
        return int(self.sizes["enc_layers" if self.family is ModelFamily.TRANSFORMER else "layers"])

    @property
    def adapters_only(self) -> bool:
        """LoRA on: only the adapters (and what else trains) travel and are averaged; frozen base weights stay."""
        return self.hf is not None and self.hf.lora.enabled

    def to_raw(self) -> dict[str, Any]:
        hf = self.hf.to_raw() if self.hf is not None else {}
        return hf | {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            **self.sizes,
            "dropout": self.dropout,
            "dropout_kernel": self.dropout_kernel,
            "max_len": self.max_len,
            "tie_embeddings": self.tie_embeddings,
            "pretrained_dir": self.pretrained_dir,
            "optimizer": self.optimizer.to_dict(),
            "lr_schedule": self.lr_schedule.to_raw(),
        }


def parse_model(raw: Any, task: TaskSpec) -> ModelSpec:
    """The ``model`` section as a ModelSpec for ``task`` (its family, positions >= task.max_len + 1)."""
    require(isinstance(raw, Mapping), "config group model is missing; add model=<name> (see conf/model)")
    cls = task_class(task.name)
    family = cls.model_family
    got = raw.get("family")
    if got == ModelFamily.HF and cls.hf_encoders:  # a pretrained BERT / RoBERTa folder (tasks/hf_encoder.py)
        family = ModelFamily.HF
        require(
            bool(raw.get("hf_folder")),
            f"task {task.name} runs a family: hf model from a pretrained BERT / RoBERTa folder: set "
            "model.hf_folder=<folder> (docs/hf_bert_tasks.md)",
        )
    require(
        got == family,
        f"model.family={got!r} cannot run task {task.name!r}, which needs a {family} model; "
        f"pick model={DEFAULT_MODELS[family]}",
    )
    require(
        "schedule" not in raw,
        "model.schedule was renamed to model.lr_schedule; rename the key (model.lr_schedule.warmup_steps=..., ...)",
    )
    sizes = SIZE_KEYS[family]
    keys = _MODEL_KEYS + (HF_KEYS if family is ModelFamily.HF else ())
    unknown = sorted(set(raw) - set(sizes) - set(keys))
    if unknown:
        valid = ", ".join(sizes + keys)
        raise ConfigError(f"unknown config key model.{unknown[0]}; a {family} model has {valid}")
    given: Any
    hf, given = parse_hf(raw, sizes) if family is ModelFamily.HF else (None, raw)
    if hf is not None:  # an encoder for ner / classification, a causal LM for causal_lm
        encoders = cls.model_family is not ModelFamily.HF
        wanted = f"a pretrained {' or '.join(ENCODER_TYPES)} folder" if encoders else ", ".join(CAUSAL_LM_TYPES)
        require(
            (hf.model_type in ENCODER_TYPES) == encoders,
            f"model.model_type={hf.model_type!r} cannot run task {task.name!r}, which needs {wanted}",
        )
    spec = ModelSpec(
        name=str(raw.get("name") or ""),
        family=family,
        description=str(raw.get("description") or ""),
        sizes={k: given.get(k) for k in sizes},
        dropout=raw.get("dropout", 0.1),
        dropout_kernel=raw.get("dropout_kernel", DropoutKernel.FAST),
        max_len=given.get("max_len"),
        tie_embeddings=raw.get("tie_embeddings", False),
        pretrained_dir=str(raw.get("pretrained_dir") or ""),
        optimizer=parse_optimizer(raw.get("optimizer")),
        lr_schedule=parse_lr_schedule(raw.get("lr_schedule")),
        hf=hf,
    )
    require(
        spec.max_len >= task.max_len + 1,
        f"model.max_len={spec.max_len} is shorter than task.max_len={task.max_len} + 1; raise model.max_len",
    )
    require(
        not spec.pretrained_dir or Path(spec.pretrained_dir).expanduser().is_dir(),
        f'model.pretrained_dir={spec.pretrained_dir!r} is not a folder; put bert-base-chinese there or set it to ""',
    )
    return spec
