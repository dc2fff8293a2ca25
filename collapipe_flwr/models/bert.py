"""BERT split CollaPipe-style, built from ``transformers``' own BertEmbeddings / BertLayer / BertPooler.

- embedding (CU): ``BertEmbeddings`` (word + position + token-type(0) embeddings, LayerNorm, dropout);
- L TEBs (devices): ``BertLayer`` wrapped so that ``block(hidden, attention_mask[B,T])`` works;
- head (server): token classification (NER; optionally with a linear-chain CRF over the tags, head
  ``token_crf``) or sequence classification (BertPooler on [CLS] + classifier, as
  ``BertForSequenceClassification``).

``pretrained_dir`` loads bert-base-chinese weights (``model.safetensors`` or ``pytorch_model.bin``) from a
local folder: ``bert.embeddings.*`` -> embedding, ``bert.encoder.layer.{l}.*`` -> block l,
``bert.pooler.*`` -> the sequence head's pooler (a ``BertModel.save_pretrained`` folder without the
``bert.`` prefix works too). Task classifiers start random.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEmbeddings, BertLayer, BertPooler

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.crf import LinearChainCRF
from collapipe_flwr.models.fast_dropout import register_attention, with_fast_dropout
from collapipe_flwr.models.split import SplitModel, TaskHead
from collapipe_flwr.torch_archive import check_archive, unbounded, walk_tensors

HEADS = ("token", "token_crf", "sequence")
# the blocks' attention (models/fast_dropout.py), registered with transformers wherever this module is imported: a
# device process unpickling a BertBlock imports it first
ATTENTION = register_attention()


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B,T] 1 = real token -> [B,1,1,T] additive mask: 0 where attended, dtype-min at padding."""
    return ((1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min).to(dtype)


class BertEmbedding(nn.Module):
    """CU part: ``BertEmbeddings`` on ``input_ids`` with all-zero token types."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.max_len = config.max_position_embeddings
        self.embeddings = BertEmbeddings(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.max_len:
            raise ConfigError(
                f"sequence length {input_ids.shape[1]} exceeds the model's max_len={self.max_len}; raise "
                "model.max_len or truncate the data"
            )
        return self.embeddings(input_ids=input_ids)


class BertBlock(nn.Module):
    """One TEB: a ``BertLayer`` fed the [B,T] mask converted to BERT's additive attention mask."""

    def __init__(self, config: BertConfig, index: int) -> None:
        super().__init__()
        self.hidden_size, self.ffn_size, self.num_heads = (
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
        )
        self.layer = BertLayer(config, layer_idx=index)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.layer(hidden, additive_mask(attention_mask, hidden.dtype))
        return out[0] if isinstance(out, tuple) else out


class TokenClassificationHead(TaskHead):
    """NER head: dropout + Linear(H, num_labels) per token; loss summed over labels != -100."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(hidden))

    def loss_terms(self, hidden, attention_mask, batch: Mapping[str, torch.Tensor]):
        logits = self.logits(hidden)
        labels = batch["labels"]
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss_sum, (labels != -100).sum()

    def predict(self, hidden, attention_mask, batch=None) -> torch.Tensor:
        """Argmax tag per token [B,T]."""
        return self.logits(hidden).argmax(-1)


class CRFTokenClassificationHead(TokenClassificationHead):
    """NER head with a linear-chain CRF (models/crf.py) over the tags of the labelled tokens.

    Emissions are the token head's logits; the CRF runs over the positions with a label (labels != -100:
    each character's token, not [CLS]/[SEP]/padding), packed to the left of each row. The loss is the
    negative log-likelihood of the gold tag sequences, returned as (sum over sentences, number of labelled
    tokens) so its scale matches the per-token cross-entropy of the plain head. Prediction is Viterbi over
    the same positions (without labels: every real token but the first and last, i.e. [CLS] and [SEP])."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__(config, num_labels)
        self.crf = LinearChainCRF(num_labels)

    def loss_terms(self, hidden, attention_mask, batch: Mapping[str, torch.Tensor]):
        return self.crf.token_loss_terms(self.logits(hidden), batch["labels"])

    def predict(self, hidden, attention_mask, batch=None) -> torch.Tensor:
        """Viterbi tag per labelled token, scattered back to [B,T] (0 elsewhere)."""
        labels = batch["labels"] if batch is not None and "labels" in batch else None
        return self.crf.token_predict(self.logits(hidden), attention_mask, labels)


class SequenceClassificationHead(TaskHead):
    """Classification head: BertPooler (tanh(W h_[CLS])) + dropout + Linear(H, num_labels)."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.pooler = BertPooler(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(hidden)))

    def loss_terms(self, hidden, attention_mask, batch: Mapping[str, torch.Tensor]):
        labels = batch["labels"]
        loss_sum = F.cross_entropy(self.logits(hidden), labels, ignore_index=-100, reduction="sum")
        return loss_sum, (labels != -100).sum()

    def predict(self, hidden, attention_mask, batch=None) -> torch.Tensor:
        """Argmax class per sentence [B]."""
        return self.logits(hidden).argmax(-1)


@dataclass(frozen=True)
class BertSplitConfig:
    """BERT's sizes and task head, checked when made (``transformers.BertConfig`` is :meth:`hf_config`).

    ``vocab_size``, ``head`` (token / token_crf / sequence) and ``num_labels`` come from the task, the rest
    from the model spec (tasks/model_config.py)."""

    vocab_size: int
    hidden: int
    n_heads: int
    d_ff: int
    layers: int
    dropout: float
    max_len: int
    head: str
    num_labels: int

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ConfigError(
                f"model head {self.head!r} is not one of {', '.join(HEADS)}; use token or token_crf (NER) or "
                "sequence (classification)"
            )
        if int(self.num_labels) < 2:
            raise ConfigError(f"num_labels={self.num_labels} must be >= 2")
        for name in ("vocab_size", "hidden", "n_heads", "d_ff", "layers", "max_len"):
            value = getattr(self, name)
            if int(value) < 1:
                raise ConfigError(f"model.{name}={value} must be >= 1")
        if self.hidden % self.n_heads:
            raise ConfigError(
                f"model.hidden={self.hidden} is not divisible by model.n_heads={self.n_heads}; pick n_heads "
                "dividing hidden"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")

    def hf_config(self) -> BertConfig:
        """The ``transformers.BertConfig`` of these sizes (sdpa attention)."""
        config = BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.n_heads,
            intermediate_size=self.d_ff,
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.dropout,
            max_position_embeddings=self.max_len,
        )
        config._attn_implementation = ATTENTION  # sdpa, with the cheaper dropout mask in CPU training
        return config


def build_bert(config: BertSplitConfig, pretrained_dir: str | None = None) -> SplitModel:
    """BERT split into embedding / L BertLayers / task head; optional bert-base-chinese weights from the local
    folder ``pretrained_dir`` (a runtime choice, not a size: None or "" = random init)."""
    hf = config.hf_config()
    model = _init_weights(
        SplitModel(
            embedding=BertEmbedding(hf),
            blocks=nn.ModuleList(BertBlock(hf, l) for l in range(config.layers)),
            head={
                "token": TokenClassificationHead,
                "token_crf": CRFTokenClassificationHead,
                "sequence": SequenceClassificationHead,
            }[config.head](hf, config.num_labels),
            family="bert",
        ),
        hf.initializer_range,
    )
    if pretrained_dir:
        load_pretrained(model, pretrained_dir)
    return with_fast_dropout(model)


def _init_weights(model: SplitModel, std: float) -> SplitModel:
    """BERT's initialisation: N(0, std) weights, zero biases, LayerNorm (1, 0)."""
    for part in model.parts():
        for module in part.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
    return model


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_checkpoint(pretrained_dir: str | Path) -> dict[str, torch.Tensor]:
    """The state dict in a local Hugging Face BERT folder, with old ``gamma``/``beta`` names renamed."""
    folder = Path(pretrained_dir).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"pretrained_dir {folder} is not a folder; point model.pretrained_dir at a local bert-base-chinese "
            "download or leave it empty"
        )
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            break
    else:
        raise ConfigError(
            f"pretrained_dir {folder} holds neither {' nor '.join(WEIGHT_FILES)}; download bert-base-chinese there or "
            "leave model.pretrained_dir empty"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw = load_file(str(path))
        else:
            raw = _torch_weights(path)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable file is a user data problem
        raise ConfigError(f"cannot read {path}: {type(err).__name__}; re-download the checkpoint") from None
    out = {}
    for key, value in raw.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[key] = value
    return out


def _torch_weights(path: Path) -> dict[str, torch.Tensor]:
    """A ``pytorch_model.bin`` read without running code (``weights_only``). A zip archive (torch >= 1.6) is
    mapped, not read, and every size it claims bounded before any is allocated (collapipe_flwr/torch_archive.py:
    no compressed or oversized record, no sparse or expanded tensor); the legacy format cannot be mapped."""
    with path.open("rb") as fh:
        zipped = fh.read(4) == b"PK\x03\x04"
    if not zipped:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    check_archive(path, "re-download the checkpoint")
    raw = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    size = path.stat().st_size
    for where, tensor in walk_tensors(raw, path):
        reason = unbounded(tensor, size)
        if reason is not None:
            raise ConfigError(f"cannot use {path}: its tensor {where} {reason}; re-download the checkpoint")
    return raw


def _strip_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if any(k.startswith("bert.") for k in state):
        return {k[len("bert.") :]: v for k, v in state.items() if k.startswith("bert.")}
    return dict(state)


def pretrained_mapping(
    model: SplitModel, state: Mapping[str, torch.Tensor]
) -> dict[str, tuple[nn.Module, str, torch.Tensor]]:
    """checkpoint key -> (module of the split model, its own key, tensor) for every weight that maps."""
    state = _strip_prefix(state)
    mapping = {}
    for key, value in state.items():
        if key.startswith("embeddings.") and not key.endswith(("position_ids", "token_type_ids")):
            mapping[key] = (model.embedding, key, value)
        elif key.startswith("encoder.layer."):
            idx, _, rest = key[len("encoder.layer.") :].partition(".")
            if int(idx) < len(model.blocks):
                mapping[key] = (model.blocks, f"{idx}.layer.{rest}", value)
        elif key.startswith("pooler.") and isinstance(model.head, SequenceClassificationHead):
            mapping[key] = (model.head, key, value)
    return mapping


def load_pretrained(model: SplitModel, pretrained_dir: str | Path) -> None:
    """Copy the checkpoint's embedding, encoder-layer (and pooler) weights into the split model."""
    mapping = pretrained_mapping(model, read_checkpoint(pretrained_dir))
    targets = {id(m): m.state_dict() for m, _, _ in mapping.values()}
    for module in (model.embedding, model.blocks):
        own = module.state_dict()
        have = {k for m, k, _ in mapping.values() if m is module}
        missing = sorted(set(own) - have)
        if missing:
            raise ConfigError(
                f"checkpoint in {pretrained_dir} has no weight for {missing[0]}; it needs at least "
                f"{len(model.blocks)} encoder layers and BERT embeddings"
            )
    for ckpt_key, (module, key, value) in mapping.items():
        want = targets[id(module)][key]
        if tuple(want.shape) != tuple(value.shape):
            raise ConfigError(
                f"checkpoint weight {ckpt_key} has shape {tuple(value.shape)} but the model expects "
                f"{tuple(want.shape)}; set the model sizes (vocab, hidden, heads, d_ff, max_len) to the checkpoint's "
                "config.json"
            )
    with torch.no_grad():
        for module, key, value in mapping.values():
            targets[id(module)][key].copy_(value)
