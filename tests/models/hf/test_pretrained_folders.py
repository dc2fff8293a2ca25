"""A pretrained model folder fails loudly at start-up (issue 67): a ``model.safetensors`` that holds only some of
the model's tensors, a tensor narrower than config.json says, or a header claiming more bytes than the file has,
is one line naming the first missing or wrong tensor, not a run on partly random weights or "an internal error"
26 s in. Partly random weights train only with ``model.allow_missing_weights=true``, and the summary says so.

Every folder here is a tiny GPT-2 saved with ``save_pretrained`` (nothing downloaded)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import GPT2Config

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.server_main import summary_lines
from collapipe_flwr.models.hf import load_hf_model
from collapipe_flwr.models.hf.folder_weights import missing_weights, random_weights_record
from collapipe_flwr.tasks.spec import parse_model
from tests.task_specs import specs

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """A complete tiny GPT-2 folder (config.json + model.safetensors)."""
    folder = tmp_path_factory.mktemp("gpt2_full")
    config = GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=64, bos_token_id=0, eos_token_id=0)
    load_hf_model(config).save_pretrained(folder)
    return folder


def _copy(full: Path, to: Path, tensors: dict) -> Path:
    to.mkdir()
    (to / "config.json").write_text((full / "config.json").read_text())
    save_file(tensors, str(to / WEIGHTS), metadata={"format": "pt"})
    return to


def _parse(folder: Path, **extra):
    task_spec, _ = specs("causal_lm", "gpt2_tiny")
    return parse_model({"name": "mine", "family": "hf", "hf_folder": str(folder), **extra}, task_spec)


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_complete_folder_parses_and_misses_nothing(full):
    assert _parse(full).sizes["hidden"] == 16
    assert missing_weights(full) == []


def test_a_partial_safetensors_is_refused_naming_the_first_missing_tensor(full, tmp_path):
    tensors = load_file(str(full / WEIGHTS))
    folder = _copy(full, tmp_path / "partial", {"transformer.wte.weight": tensors["transformer.wte.weight"]})
    with pytest.raises(ConfigError) as err:
        _parse(folder)
    message = _one_line(err)
    assert "transformer.wpe.weight" in message and "model.allow_missing_weights=true" in message
    assert f"{len(tensors) - 1} of the model's {len(tensors)}" in message


def test_missing_weights_train_only_when_allowed_and_the_summary_says_so(full, tmp_path):
    tensors = load_file(str(full / WEIGHTS))
    folder = _copy(full, tmp_path / "partial", {"transformer.wte.weight": tensors["transformer.wte.weight"]})
    spec = _parse(folder, allow_missing_weights=True)
    assert spec.hf.allow_missing_weights and spec.hf.to_raw()["allow_missing_weights"] is True
    assert len(missing_weights(folder)) == len(tensors) - 1
    first = {"count": len(tensors) - 1, "first": "transformer.wpe.weight"}
    assert random_weights_record(spec.hf) == {"random_weights": first}  # what write_outputs adds to summary.json
    assert random_weights_record(_parse(full, allow_missing_weights=True).hf) == {}
    summary = {"final_val": {}, "num_rounds": 1, "random_weights": {"count": 27, "first": "transformer.wpe.weight"}}
    lines = summary_lines(summary, tmp_path, "perplexity")
    assert any("27 weights" in line and "random" in line for line in lines)


def test_weights_narrower_than_config_json_are_refused_naming_the_tensor(full, tmp_path):
    tensors = load_file(str(full / WEIGHTS))
    narrow = {k: (v[..., :8].contiguous() if v.dim() == 2 else v) for k, v in tensors.items()}
    folder = _copy(full, tmp_path / "narrow", narrow)
    with pytest.raises(ConfigError) as err:
        _parse(folder, allow_missing_weights=True)  # a wrong shape is refused even then
    message = _one_line(err)
    assert "transformer.wte.weight" in message and "shape [64, 8]" in message and "needs [64, 16]" in message


@pytest.mark.parametrize(
    "header, match",
    [
        (struct.pack("<Q", 2**63) + b"\0" * 64, "not a readable safetensors file .*header too large"),
        (struct.pack("<Q", 5) + b"{nope", "not a readable safetensors file"),
        (struct.pack("<Q", 2) + b"[]", "not a readable safetensors file"),
        (b"\x01", "not a readable safetensors file"),
    ],
)
def test_a_damaged_safetensors_header_is_one_line(full, tmp_path, header, match):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text((full / "config.json").read_text())
    (folder / WEIGHTS).write_bytes(header)
    with pytest.raises(ConfigError, match=match) as err:
        _parse(folder)
    _one_line(err)


def test_a_tensor_whose_offsets_pass_the_file_end_is_refused(full, tmp_path):
    header = json.dumps({"transformer.wte.weight": {"dtype": "F32", "shape": [64, 16], "data_offsets": [0, 4096]}})
    folder = tmp_path / "short"
    folder.mkdir()
    (folder / "config.json").write_text((full / "config.json").read_text())
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 100)
    with pytest.raises(ConfigError, match="not a readable safetensors file") as err:
        _parse(folder)
    _one_line(err)


def test_pickled_weights_are_checked_from_the_load_report(full, tmp_path):
    """A folder of ``pytorch_model.bin`` (not read when the config is parsed) is refused when the model is built."""
    import torch

    from collapipe_flwr.tasks.model_config import _folder_causal_lm

    tensors = load_file(str(full / WEIGHTS))
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((full / "config.json").read_text())
    torch.save({"transformer.wte.weight": tensors["transformer.wte.weight"]}, folder / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="holds no transformer.h.0.attn.c_attn.bias") as err:
        _folder_causal_lm(_parse(folder).hf)
    _one_line(err)
    assert _folder_causal_lm(_parse(folder, allow_missing_weights=True).hf).config.n_embd == 16
