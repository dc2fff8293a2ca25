"""The frozen base in bf16 / int8 (models/hf/frozen_base.py) built from a folder's memory-mapped safetensors file:
once the TEBs' fp32 weights are converted, no weight of the split is left in the file's mapping, so the mapping (the
whole file, resident wherever the conversion read it) goes, and the weights are the file's values.

Read from the process itself (``/proc/self/maps``: which files it maps), the independent reference for the values
the fp32 model transformers loads from the same folder. The base: the tiny Llama GGUF file (tests/gguf_files.py),
dequantised into this test's own cache folder (models/hf/gguf_cache.py)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from collapipe_flwr.models.hf import gguf_cache, load_hf_model
from collapipe_flwr.models.hf.frozen_base import loaded_storages, own_loaded_weights
from collapipe_flwr.tasks import model_config
from tests.gguf_files import write_tiny_llama
from tests.task_specs import specs

NAME = "tiny.gguf"
SPECIAL = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A model folder holding the tiny GGUF file, with this test's own cache root (its safetensors file unique)."""
    out = tmp_path / "model"
    out.mkdir()
    write_tiny_llama(out / NAME)
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    return out


def mapped_safetensors(cache: Path) -> list[str]:
    """The safetensors files under ``cache`` this process maps now."""
    gc.collect()
    with open("/proc/self/maps") as maps:
        paths = {line.split(maxsplit=5)[-1].strip() for line in maps if line.count(" ") >= 5}
    return sorted(p for p in paths if p.startswith(str(cache)) and p.endswith(".safetensors"))


def build(folder: Path, base_dtype: str):
    """The SmolLM2 preset (LoRA on q/k/v/o) on the tiny folder: its split, the frozen base in ``base_dtype``."""
    over = {"hf_folder": str(folder), "gguf_file": NAME, "base_dtype": base_dtype}
    _, spec = specs("causal_lm", "smollm2_135m", model_over=over)
    return model_config.build_causal_lm(spec, 64, SPECIAL)


@linux
@pytest.mark.parametrize("base_dtype", ["bf16", "int8"])
def test_a_converted_base_leaves_no_weight_in_the_files_mapping(folder, tmp_path, base_dtype):
    split = build(folder, base_dtype)
    assert mapped_safetensors(tmp_path / "cache") == []
    reference = load_hf_model(folder, "causal_lm", gguf_file=NAME)  # fp32, straight from the cached file
    assert len(mapped_safetensors(tmp_path / "cache")) == 1  # the check sees the mapping while a weight lives
    assert torch.equal(split.embedding.token_embedding.weight, reference.model.embed_tokens.weight)
    assert torch.equal(split.head.lm_head.weight, reference.lm_head.weight)
    assert torch.equal(split.head.norm.weight, reference.model.norm.weight)
    block = split.blocks[1].layer
    assert torch.equal(block.input_layernorm.weight, reference.model.layers[1].input_layernorm.weight)
    if base_dtype == "bf16":
        mlp = reference.model.layers[1].mlp.down_proj.weight
        assert torch.equal(block.mlp.down_proj.weight, mlp.to(torch.bfloat16))


@linux
def test_an_fp32_base_reads_its_weights_from_the_mapping(folder, tmp_path):
    """Nothing converted: every weight is still the file's, which stays mapped (shared page cache, no copy)."""
    split = build(folder, "fp32")
    assert len(mapped_safetensors(tmp_path / "cache")) == 1
    del split
    assert mapped_safetensors(tmp_path / "cache") == []


def test_own_loaded_weights_copies_only_the_loaded_tensors_in_place():
    """The same Parameter objects with their values and flags; a tensor met in two modules copied once."""
    shared = nn.Linear(3, 4)
    first, second = nn.Sequential(shared, nn.LayerNorm(4)), nn.Sequential(shared)
    first[1].weight.requires_grad_(False)
    loaded = loaded_storages(first)
    fresh = nn.Linear(4, 2)  # made after the load: never copied
    before = {n: (p, p.detach().clone(), p.data_ptr()) for n, p in first.named_parameters()}
    fresh_ptr = fresh.weight.data_ptr()
    copied = own_loaded_weights([first, second, fresh], loaded)
    assert copied == sum(p.nbytes for p in first.parameters())
    for name, p in first.named_parameters():
        same, values, ptr = before[name]
        assert p is same and torch.equal(p, values) and p.data_ptr() != ptr
    assert not first[1].weight.requires_grad and first[0].weight.requires_grad
    assert second[0].weight is first[0].weight and fresh.weight.data_ptr() == fresh_ptr
