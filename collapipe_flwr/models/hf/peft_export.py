"""A split causal LM back in one piece: adapters in PEFT's own format and the merged un-split model.

The split (``splitter.py``) keeps the model's own modules under new names: the CU's embedding (GPT-2's
``wte``/``wpe``, Llama's ``embed_tokens``), the TEBs as ``"{l}.layer.<module>"`` and the server's head as
``norm`` + ``lm_head``. :data:`PLACES` says where each part sits in the un-split ``*ForCausalLM`` (the paths
``gpt2.py`` and ``llama.py`` cut them from), which maps every tensor back:

- the base weights -> the un-split model's names (LoRA's ``.base_layer.`` dropped): :func:`unsplit_model`;
- the adapters ``"{l}.layer.self_attn.q_proj.lora_A.default.weight"`` -> PEFT's
  ``"base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight"``: :func:`adapter_state`.

:func:`write_adapters` writes ``adapter_config.json`` (peft's ``LoraConfig.to_dict()``, as its own
``save_pretrained`` writes it) and ``adapter_model.safetensors``, the two files
``peft.PeftModel.from_pretrained(base, folder)`` reads; :func:`write_merged` writes the un-split model with the
adapters merged (peft's ``merge_and_unload``) as a plain Hugging Face folder; :func:`write_base` the base the
adapters load on without this project (``peft.AutoPeftModelForCausalLM.from_pretrained(folder)``: the choice of
that base and how the adapter folder names it is models/hf/peft_base.py's).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from torch import nn
from transformers import AutoModelForCausalLM

from collapipe_flwr.atomic_files import file_errors, replace_atomically, write_atomic
from collapipe_flwr.errors import CollaPipeError, UnsupportedModelError
from collapipe_flwr.models.hf.int8_base import full_precision
from collapipe_flwr.models.hf.loading import quiet_transformers
from collapipe_flwr.models.hf.peft_base import BASE_DIR, base_pointer, keep_stored_dtypes

_LLAMA = ("model.", "model.layers.", "model.norm.")
# model type -> (prefix of the embedding's tensors, of the TEB stack, of the final norm) in the *ForCausalLM
PLACES: dict[str, tuple[str, str, str]] = {
    "gpt2": ("transformer.", "transformer.h.", "transformer.ln_f."),
    "llama": _LLAMA,
    "qwen2": _LLAMA,
    "mistral": _LLAMA,
}
PEFT_PREFIX = "base_model.model."  # where PeftModelForCausalLM puts the un-split model
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"  # the adapter name peft gives when none is asked for (lora.py injects that one)


def model_type_of(blocks: nn.ModuleList) -> str:
    """The Hugging Face model type of the split's TEBs; UnsupportedModelError for anything but a causal LM."""
    model_type = str(getattr(blocks[0], "model_type", "")) if len(blocks) else ""
    if model_type not in PLACES:
        raise UnsupportedModelError(
            f"only a Hugging Face causal LM ({', '.join(PLACES)}) is exported to PEFT's format, not {model_type!r}"
        )
    return model_type


def _block_name(name: str, stack: str) -> str | None:
    """``"{l}.layer.<rest>"`` -> ``"<stack>{l}.<rest>"``; None for the block's own index buffer."""
    index, _, rest = name.partition(".")
    if not rest.startswith("layer."):
        return None  # "{l}.layer_index": the split's bookkeeping, no weight of the model
    return f"{stack}{index}.{rest[len('layer.') :]}"


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().clone()


def base_state(embedding: nn.Module, blocks: nn.ModuleList, head: nn.Module) -> dict[str, torch.Tensor]:
    """The un-split model's state dict of the split's base weights (without the adapters; an int8 base
    dequantized, models/hf/int8_base.py)."""
    embed, stack, norm = PLACES[model_type_of(blocks)]
    out = {f"{embed}{k}": _cpu(v) for k, v in embedding.state_dict().items()}
    for name, t in full_precision(blocks).state_dict().items():
        mapped = _block_name(name, stack)
        if mapped is not None and ".lora_" not in mapped:
            out[mapped.replace(".base_layer.", ".")] = _cpu(t)
    for name, t in head.state_dict().items():
        out[f"{norm}{name[len('norm.') :]}" if name.startswith("norm.") else name] = _cpu(t)
    return out


def adapter_state(blocks: nn.ModuleList) -> dict[str, torch.Tensor]:
    """The TEBs' adapters under PEFT's saved names (``base_model.model.<module>.lora_A.weight``)."""
    stack = PLACES[model_type_of(blocks)][1]
    out = {}
    for name, t in blocks.state_dict().items():
        mapped = _block_name(name, stack)
        if mapped is not None and ".lora_" in mapped:
            out[PEFT_PREFIX + mapped.replace(f".{ADAPTER_NAME}.", ".")] = _cpu(t)
    return out


def unsplit_model(embedding: nn.Module, blocks: nn.ModuleList, head: nn.Module) -> Any:
    """The un-split ``*ForCausalLM`` (fp32, eval mode, KV cache on) holding the split's base weights; the LM head
    stays tied to the embedding when the original tied it and the two copies still hold equal values."""
    config = copy.deepcopy(getattr(blocks[0], "config"))  # noqa: B009 - an HFBlock's config
    config.use_cache = True
    if getattr(head, "tied", False):
        tokens: Any = embedding
        lm_head: Any = head
        config.tie_word_embeddings = bool(
            torch.equal(_cpu(tokens.token_embedding.weight), _cpu(lm_head.lm_head.weight))
        )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = base_state(embedding, blocks, head)
    problem = model.load_state_dict(state, strict=False)
    if problem.missing_keys or problem.unexpected_keys:
        raise UnsupportedModelError(
            f"the split {config.model_type} does not map back onto {type(model).__name__}: missing "
            f"{problem.missing_keys[:3]}, unexpected {problem.unexpected_keys[:3]}"
        )
    return model.eval()


def merged_copy(blocks: nn.ModuleList) -> nn.ModuleList:
    """A copy of the TEBs with every LoRA adapter merged into its base weight (peft's ``LoraLayer.merge``); the
    same blocks, copied, when they carry none. An int8 base is dequantized first (fp32 weights to merge into)."""
    from peft.tuners.lora import LoraLayer

    out = full_precision(blocks)
    out = copy.deepcopy(blocks) if out is blocks else out
    for module in out.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return out


def peft_config(lora: LoraConfig, base: str | None) -> LoraConfig:
    """A copy of the adapters' ``LoraConfig`` as a saved causal-LM adapter: task type CAUSAL_LM, the base named."""
    out = copy.deepcopy(lora)
    out.task_type = "CAUSAL_LM"
    out.base_model_name_or_path = base
    return out


def config_json(config: LoraConfig) -> str:
    """``adapter_config.json`` as peft's ``PeftConfigMixin.save_pretrained`` writes it (sets as lists)."""
    out = config.to_dict()
    out = {k: sorted(v) if isinstance(v, set) else v for k, v in out.items()}
    return json.dumps(out, indent=2, sort_keys=True)


def write_adapters(folder: Path, blocks: nn.ModuleList, config: LoraConfig) -> Path:
    """``folder/adapter_config.json`` + ``folder/adapter_model.safetensors``, each replaced atomically."""
    from safetensors.torch import save

    tensors = adapter_state(blocks)
    with file_errors(folder, "create"):
        folder.mkdir(parents=True, exist_ok=True)
    data = save(tensors, metadata={"format": "pt"})
    replace_atomically(folder / ADAPTER_WEIGHTS, lambda fh: fh.write(data))
    write_atomic(folder / ADAPTER_CONFIG, config_json(config) + "\n")
    return folder


def merged_model(embedding: nn.Module, blocks: nn.ModuleList, head: nn.Module, config: LoraConfig) -> Any:
    """The un-split model with the split's adapters merged into its weights (peft's ``merge_and_unload``)."""
    with quiet_transformers():
        peft_model = get_peft_model(unsplit_model(embedding, blocks, head), copy.deepcopy(config))
    result: Any = set_peft_model_state_dict(peft_model, adapter_state(blocks))
    if result.unexpected_keys:
        raise UnsupportedModelError(f"PEFT's model has no place for the adapters {result.unexpected_keys[:3]}")
    return peft_model.merge_and_unload().eval()


def write_merged(folder: Path, model: Any, tokenizer_dir: Path | None = None) -> Path:
    """``model.save_pretrained`` (+ the tokenizer files of ``tokenizer_dir``) into ``folder``, replaced whole."""

    def fill(tmp: Path) -> None:
        with quiet_transformers():
            model.save_pretrained(str(tmp))
        if tokenizer_dir is not None and tokenizer_dir.is_dir():
            for source in tokenizer_dir.iterdir():
                if source.is_file():
                    shutil.copyfile(source, tmp / source.name)

    replace_folder(folder, fill)
    return folder


def replace_folder(folder: Path, fill: Callable[[Path], object]) -> None:
    """Fill a temporary sibling of ``folder``, then swap it into ``folder``'s place (two renames; the old folder
    comes back if the second fails). A failed write leaves the old folder and is one line naming it."""
    from safetensors import SafetensorError

    with file_errors(folder, "write"):
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    old = folder.parent / f"{tmp.name}.old"
    try:
        fill(tmp)
        if folder.exists():
            os.replace(folder, old)
        try:
            os.replace(tmp, folder)
        except OSError:
            if old.exists():
                os.replace(old, folder)
            raise
    except (OSError, RuntimeError, SafetensorError) as err:
        reason = getattr(err, "strerror", None) or (str(err).splitlines() or [type(err).__name__])[0][:120]
        raise CollaPipeError(f"cannot write {folder}: {reason}; free disk space or choose a writable folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def write_base(target: Path, parts: tuple[nn.Module, nn.ModuleList, nn.Module], tokenizer_dir: Path | None) -> Path:
    """``target/base/``: the un-split base the adapters were trained over, each tensor in the dtype the split
    stores it in, and the tokenizer files of ``tokenizer_dir``, replaced whole (models/hf/peft_base.py)."""
    model = keep_stored_dtypes(unsplit_model(*parts), base_state(*parts))
    return write_merged(target / BASE_DIR, model, tokenizer_dir)


def write_adapter_folder(
    folder: Path, blocks: nn.ModuleList, lora: LoraConfig, base_dir: Path, source: str = "", gguf_file: str = ""
) -> Path:
    """``folder``: the adapters in PEFT's format over ``base_dir`` (its absolute path in ``adapter_config.json``,
    its path relative to ``folder`` in ``base_model.json``; ``source`` and ``gguf_file``: the run's configured
    base, recorded there)."""
    write_adapters(folder, blocks, peft_config(lora, str(base_dir.resolve())))
    base_pointer(folder, base_dir, source, gguf_file)
    return folder


def export_lora(
    target: Path,
    parts: tuple[nn.Module, nn.ModuleList, nn.Module],
    lora: LoraConfig,
    source: str = "",
    gguf_file: str = "",
) -> dict[str, str]:
    """``target/base/`` (the base, a Hugging Face folder), ``target/peft/`` (the adapters, PEFT's format, over
    that base) and ``target/merged/`` (the merged un-split model), each with the tokenizer files of
    ``target/tokenizer/`` where a model loads; returns those folders' names relative to ``target``. ``source``:
    the run's ``model.hf_folder`` as configured ("" = from scratch), ``gguf_file`` its ``model.gguf_file``."""
    base_dir = write_base(target, parts, target / "tokenizer")
    write_adapter_folder(target / "peft", parts[1], lora, base_dir, source, gguf_file)
    merged = merged_model(*parts, peft_config(lora, str(base_dir.resolve())))
    write_merged(target / "merged", merged, target / "tokenizer")
    return {"peft": "peft", "merged": "merged", "base": BASE_DIR}
