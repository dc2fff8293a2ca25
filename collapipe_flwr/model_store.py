"""The saved-model format shared by central and federated training.

A run folder holds ``model/`` with::

    embedding.safetensors   state dict of the CU's embedding
    encoder.safetensors     state dict of the L encoder blocks (a ModuleList: "0.attn....", "1....")
    head.safetensors        state dict of the server's head (decoder / classifier)
    tokenizer/              the tokenizer files the task used (trained BPE json, or the BERT vocab.txt)
    model.json              {"format": 1, "config": <composed run config>, "info": {...}, "tokenizer": {...}}

``config`` is the composed run config (at least task, model, seed, data_dir), so :func:`load_model`
rebuilds the same task and model and loads the weights strictly. Every file is written atomically and
model.json last: a folder with model.json is complete.

A LoRA model (``model.lora.enabled``) saves only what trained: each part's file holds its trainable tensors
(the adapters of the TEBs; an empty file for a frozen part) and model.json records ``"tensors": "trainable"``.
The frozen base is the config's reference: ``model.hf_folder`` (the base model's folder), or the inline
architecture and seed that rebuild it; :func:`load_model` rebuilds it that way and loads the adapters over it.
A LoRA causal LM also goes out as ``base/`` (the base it trained over, a plain Hugging Face folder), ``peft/``
(the adapters in PEFT's own format over it) and ``merged/`` (the un-split model with them merged), listed under
model.json's ``"exports"`` (docs/hf_export.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from collapipe_flwr.config import resolve_data_dir
from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.models.split import PARTS
from collapipe_flwr.models.trainable import trainable_names
from collapipe_flwr.tasks.data_files import resolve_file
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.spec import parse_model, parse_task

FORMAT = 1
MODEL_DIR = "model"
META_FILE = "model.json"
TOKENIZER_DIR = "tokenizer"
_RUN_HINT = "pass a run folder written by train_central --save or by a federated run"


# ----------------------------------------------------------------------------- writing
def _atomic(path: Path, write: Callable[[str], object]) -> None:
    """Write ``path`` through ``write(tmp_name)`` into a temp file of the same folder, then rename."""
    from safetensors import SafetensorError

    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise CollaPipeError(
            f"cannot write {path}: {err.strerror}; free disk space or choose a writable folder"
        ) from None
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError, SafetensorError) as err:  # how safetensors / torch report a full disk
        Path(tmp).unlink(missing_ok=True)
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0][:120]
        raise CollaPipeError(
            f"cannot write {path}: {reason}; free disk space or choose a writable folder (is the disk full?)"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _tensors(module: torch.nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The module's state dict as contiguous CPU tensors, each with its own storage (tied weights are cloned);
    ``trainable_only``: the tensors of its trainable parameters only (LoRA: the adapters)."""
    keep = trainable_names(module) if trainable_only else None
    return {
        name: t.detach().to("cpu").contiguous().clone()
        for name, t in module.state_dict().items()
        if keep is None or name in keep
    }


def adapters_only(config: Mapping[str, Any]) -> bool:
    """Whether the config's model trains LoRA adapters only (``model.lora.enabled``): then only they are saved."""
    lora = (config.get("model") or {}).get("lora") or {}
    return bool(isinstance(lora, Mapping) and lora.get("enabled"))


def _save_part(path: Path, module: torch.nn.Module, part: str, trainable_only: bool = False) -> None:
    from safetensors.torch import save_file

    tensors = _tensors(module, trainable_only)
    _atomic(path, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt", "part": part}))


def save_model(
    folder: str | os.PathLike,
    config: Mapping[str, Any],
    embedding: torch.nn.Module,
    blocks: torch.nn.ModuleList,
    head: torch.nn.Module,
    info: dict | None = None,
    *,
    task=None,
) -> Path:
    """Write ``<folder>/model/`` (three safetensors files, the tokenizer files, model.json); return that folder.

    ``task`` (optional) is the Task the model was trained with: its tokenizer files are copied and
    described; without it model.json records the task's tokenizer config only.
    """
    for key in ("task", "model"):
        if not isinstance(config.get(key), Mapping):
            raise ConfigError(f"cannot save a model without config section {key!r}; pass the composed run config")
    target = Path(folder).expanduser() / MODEL_DIR
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create {target}: {err.strerror}; pick a writable folder to save the model") from None
    partial = adapters_only(config)
    for part, module in zip(PARTS, (embedding, blocks, head)):
        _save_part(target / f"{part}.safetensors", module, part, partial)
    meta = {
        "format": FORMAT,
        "tensors": "trainable" if partial else "all",
        "config": dict(config),
        "info": dict(info or {}),
        "tokenizer": describe_tokenizer(task, target) if task is not None else _tokenizer_config(config["task"]),
    }
    exports = _export_lora_causal_lm(target, config, (embedding, blocks, head))
    if exports:
        meta["exports"] = exports
    text = json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n"
    _atomic(target / META_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return target


def peft_settings(config: Mapping[str, Any], blocks: torch.nn.ModuleList) -> tuple[Any, str]:
    """(the LoraConfig of a LoRA causal LM's PEFT export, "") | (None, why it has none: "" for a model that is
    no LoRA causal LM, the reason for one that is but cannot be exported)."""
    from collapipe_flwr.tasks.hf_spec import parse_lora

    if not adapters_only(config) or config["task"].get("name") != "causal_lm":
        return None, ""
    lora = parse_lora(config["model"].get("lora"))
    if lora.train_head:
        return None, "model.lora.train_head: the trained head is no LoRA adapter, so no PEFT export"
    from collapipe_flwr.models.hf.lora import lora_config
    from collapipe_flwr.models.hf.peft_export import model_type_of

    return lora_config(model_type_of(blocks), lora.r, lora.alpha, lora.dropout, lora.target_modules or None), ""


def _export_lora_causal_lm(target: Path, config: Mapping[str, Any], parts: tuple) -> dict:
    """A LoRA causal LM (head frozen) also goes out as ``base/`` + ``peft/`` (the adapters in PEFT's own format
    over it) and ``merged/`` (a plain Hugging Face folder), docs/hf_export.md; {} for every other model (what each
    folder holds)."""
    settings, skipped = peft_settings(config, parts[1])
    if settings is None:
        return {"skipped": skipped} if skipped else {}
    from collapipe_flwr.models.hf.peft_export import export_lora

    model = config["model"]
    return export_lora(target, parts, settings, str(model.get("hf_folder") or ""), str(model.get("gguf_file") or ""))


# ----------------------------------------------------------------------------- tokenizer
def _tokenizer_config(task_cfg: Mapping[str, Any]) -> dict:
    """What the task config says about its tokenizer (when no Task object is at hand)."""
    if task_cfg.get("vocab_file"):
        return {"kind": "bert_wordpiece", "vocab_file": task_cfg["vocab_file"]}
    return {"kind": "task_config", "config": dict(task_cfg.get("tokenizer") or {})}


def _copy(source: Path, dest: Path) -> None:
    _atomic(dest, lambda tmp: shutil.copyfile(source, tmp))


def describe_tokenizer(task, target: Path) -> dict:
    """Copy the task's tokenizer files to ``target/tokenizer/`` and describe them (kind, sizes, sources)."""
    folder = Path(target) / TOKENIZER_DIR
    tokenizer: Any = task.tokenizer() if callable(getattr(task, "tokenizer", None)) else None
    from_folder = getattr(getattr(task, "model_spec", None), "hf", None) is not None  # a model folder's tokenizer
    if callable(getattr(tokenizer, "save_pretrained", None)) and (from_folder or not task.options.get("vocab_file")):
        tokenizer.save_pretrained(str(folder))  # a Hugging Face tokenizer (causal_lm, HF encoders): its folder format
        return {
            "kind": "hf_tokenizer",
            "library": "transformers",
            "vocab_size": len(tokenizer),
            "folder": TOKENIZER_DIR,
        }
    if callable(getattr(task, "tokenizers", None)):  # translation: one trained subword tokenizer per side
        settings = dict(task.options.get("tokenizer") or {})
        hf = dict(task.spec.hf_dataset)
        folder.mkdir(parents=True, exist_ok=True)
        out = {
            "kind": settings.get("kind", "bpe"),
            "library": "tokenizers",
            "settings": settings,
            "cache_dir": str(Path(task.cache_dir) / "tokenizers"),
            "files": {},
            "trained_on": {},
        }
        for side, tok in zip(("src", "tgt"), task.tokenizers()):
            _atomic(folder / f"{side}.json", tok.save)
            out[f"{side}_vocab_size"] = int(tok.get_vocab_size())
            out["files"][side] = f"{TOKENIZER_DIR}/{side}.json"
            name = task.options.get(f"train_{side}") or ""
            out["trained_on"][side] = hf.get("id", "") if hf.get("enabled") else str(Path(task.data_dir) / name)
        return out
    vocab_file = task.options.get("vocab_file")
    if callable(getattr(task, "tokenizer", None)) and vocab_file:  # ner / classification: the BERT vocab
        source = resolve_file(task.data_dir, vocab_file, "BERT vocabulary (vocab.txt)")
        folder.mkdir(parents=True, exist_ok=True)
        _copy(source, folder / "vocab.txt")
        return {
            "kind": "bert_wordpiece",
            "library": "transformers",
            "vocab_size": int(len(task.tokenizer())),
            "vocab_file": str(source),
            "do_lower_case": True,
            "files": {"vocab": f"{TOKENIZER_DIR}/vocab.txt"},
        }
    return _tokenizer_config(task.spec.to_raw())


def _vocab_sizes(task) -> dict[str, int]:
    if callable(getattr(task, "tokenizers", None)):
        return {f"{side}_vocab_size": int(tok.get_vocab_size()) for side, tok in zip(("src", "tgt"), task.tokenizers())}
    if callable(getattr(task, "tokenizer", None)):
        return {"vocab_size": int(len(task.tokenizer()))}
    return {}


def _check_tokenizer(task, saved: Mapping[str, Any], model_dir: Path) -> None:
    """The rebuilt task's tokenizer must have the vocabulary sizes recorded at save time."""
    for key, size in _vocab_sizes(task).items():
        if key in saved and int(saved[key]) != size:
            raise ConfigError(
                f"the task's tokenizer has {key}={size} but {model_dir / META_FILE} records {saved[key]}; "
                "point data_dir at the data (and cache_dir at the tokenizer cache) the model was trained with"
            )


# ----------------------------------------------------------------------------- reading
def model_dir_of(folder: str | os.PathLike) -> Path:
    """The ``model/`` folder of a run folder (or the folder itself when it is one)."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model folder {path} does not exist; {_RUN_HINT}")
    if (path / MODEL_DIR / META_FILE).is_file():
        return path / MODEL_DIR
    if (path / META_FILE).is_file():
        return path
    raise ConfigError(f"{path} has no {MODEL_DIR}/{META_FILE}; {_RUN_HINT}")


def read_meta(model_dir: Path) -> dict:
    """model.json, checked for its format and the task/model config sections."""
    path = Path(model_dir) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {path} ({err}); the model folder is damaged, save the model again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ConfigError(f"{path} has format {got!r}, this version reads format {FORMAT}; save the model again")
    cfg = meta.get("config")
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k), dict) for k in ("task", "model")):
        raise ConfigError(f"{path} has no config with task and model sections; save the model again")
    if "schedule" in cfg["model"] and "lr_schedule" not in cfg["model"]:  # saved before the key was renamed
        cfg["model"]["lr_schedule"] = cfg["model"].pop("schedule")
    return meta


def _data_dir(explicit: str | os.PathLike | None, saved: str | None) -> Path:
    """``explicit``, else the saved data_dir when it exists here, else $COLLAPIPE_DATA_DIR."""
    if explicit:
        return resolve_data_dir(explicit)
    if saved and Path(str(saved)).expanduser().is_dir():
        return resolve_data_dir(saved)
    return resolve_data_dir(None)


def _fit_problem(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """'' when ``state`` loads strictly into ``module``, else what does not fit (first few names)."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("shape (saved vs config)", shapes)):
        if names:
            more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
            problems.append(f"{label}: {', '.join(names[:3])}{more}")
    return "; ".join(problems)


def _load_part(path: Path, module: torch.nn.Module, cfg: Mapping[str, Any], partial: bool = False) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise ConfigError(f"{path} is missing; the model folder is incomplete, save the model again")
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as err:
        raise ConfigError(f"cannot read {path} ({err}); the file is damaged, save the model again") from None
    problem = _fit_problem(module, {**module.state_dict(), **state} if partial else state)
    if partial and not problem and set(state) != trainable_names(module):
        problem = f"{len(state)} saved tensors for the {len(trainable_names(module))} trainable ones of the config"
    if problem:
        raise ConfigError(
            f"{path.name} does not fit task={cfg['task'].get('name')!r} model={cfg['model'].get('name')!r} "
            f"of {META_FILE} "
            f"({problem}); the weights and model.json come from different runs"
        )
    bad = next((k for k, v in state.items() if torch.is_floating_point(v) and not bool(torch.isfinite(v).all())), None)
    if bad is not None:
        raise ConfigError(
            f"{path} holds NaN or infinite values in {bad}: the run that saved it diverged; evaluate a model saved "
            "before it diverged, or train again with a lower learning rate"
        )
    module.load_state_dict(state, strict=not partial)


def load_model(
    folder: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    cache_dir=None,
    *,
    task_overrides: Mapping[str, Any] | None = None,
):
    """(config, task, model) of a saved model: the task rebuilt from model.json over ``data_dir`` (default:
    the saved data_dir, else $COLLAPIPE_DATA_DIR), the model built by the task and its weights loaded strictly.
    ``task_overrides`` changes keys of the saved task config (e.g. ``{"test_file": "toutiao/test.txt"}``)."""
    model_dir = model_dir_of(folder)
    meta = read_meta(model_dir)
    cfg = meta["config"]
    if task_overrides:
        cfg = {**cfg, "task": {**cfg["task"], **task_overrides}}
    for part in PARTS:
        if not (model_dir / f"{part}.safetensors").is_file():
            missing = model_dir / f"{part}.safetensors"
            raise ConfigError(f"{missing} is missing; the model folder is incomplete, save the model again")
    seed = int(cfg.get("seed", 0))
    if cache_dir is None and cfg["task"].get("cache_dir"):
        cache_dir = cfg["task"]["cache_dir"]
    task_spec = parse_task(cfg["task"])
    task = build_task(
        task_spec,
        parse_model(cfg["model"], task_spec),
        _data_dir(data_dir, cfg.get("data_dir")),
        seed,
        Path(cache_dir).expanduser() if cache_dir else None,
    )
    model = task.build_model(seed)
    _check_tokenizer(task, meta.get("tokenizer") or {}, model_dir)
    partial = meta.get("tensors") == "trainable"  # LoRA: the adapters over the base the config rebuilds
    for part, module in zip(PARTS, model.parts()):
        _load_part(model_dir / f"{part}.safetensors", module, cfg, partial)
    return cfg, task, model
