"""``generate`` refuses bad arguments, prompts and folders in one line with exit code 2 (issue 67): a temperature
that overflows the logits, a seed torch cannot take, a prompt that is not UTF-8, a damaged ``model/merged`` or
``model/peft`` folder, an adapter rank larger than the layer it adapts (10^8 died in the allocator), and a
``target_modules`` regular expression that backtracks for minutes are each one ``error:`` line, no traceback."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import struct
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file, save_file

from collapipe_flwr.apps import generate
from collapipe_flwr.config import compose
from tests.models.hf.test_peft_export import _trained_and_saved

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def run(data_dir, cache, tmp_path_factory):
    """A from-scratch GPT-2 LoRA run saved with its PEFT and merged exports."""
    cfg = compose(["task=causal_lm", "model=gpt2_tiny"])
    return _trained_and_saved(cfg, data_dir, cache, tmp_path_factory.mktemp("gen") / "run", steps=1)


def _refused(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        generate.main(argv)
    assert done.value.code == 2 and out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("error: "), err.getvalue()
    return err.getvalue()


@pytest.mark.parametrize(
    "args, match",
    [
        (["--prompt", "a", "--temperature", "1e-300"], "--temperature=1e-300"),
        (["--prompt", "a", "--temperature", "1e300"], "--temperature=1e+300"),
        (["--prompt", "a", "--seed", str(2**64)], f"--seed={2**64}"),
        (["--prompt", "a\udcff"], "not valid UTF-8"),  # how Python hands on an argument of invalid UTF-8 bytes
    ],
)
def test_bad_sampling_arguments_and_prompts_are_one_line(run, args, match):
    assert match in _refused([str(run), *args])


@pytest.mark.e2e
def test_an_invalid_utf8_prompt_on_the_command_line_exits_2(run):
    done = subprocess.run(
        [sys.executable, "-m", "collapipe_flwr.apps.generate", str(run).encode(), b"--prompt", b"caf\xe9"],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.count(b"\n") == 1 and b"not valid UTF-8" in done.stderr, done.stderr[-600:]


def _damaged(run, tmp_path, part: str, name: str, content) -> str:
    """A copy of the run whose ``model/<part>/<name>`` holds ``content`` (bytes, or a dict written as JSON)."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    path = copy / "model" / part / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(copy)


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("model.safetensors", struct.pack("<Q", 2**63) + b"\0" * 16, "header too large"),
        ("config.json", b"[]", "config.json"),
        ("tokenizer.json", b"{", "cannot load the tokenizer"),
    ],
)
def test_a_damaged_merged_folder_is_one_line(run, tmp_path, name, content, match):
    assert match in _refused([_damaged(run, tmp_path, "merged", name, content), "--prompt", "a"])


def test_a_merged_folder_missing_weights_names_the_first(run, tmp_path):
    weights = load_file(str(run / "model" / "merged" / "model.safetensors"))
    copy = _damaged(run, tmp_path, "merged", "config.json", (run / "model" / "merged" / "config.json").read_bytes())
    save_file({"transformer.wte.weight": weights["transformer.wte.weight"]}, f"{copy}/model/merged/model.safetensors")
    assert "holds no transformer.wpe.weight" in _refused([copy, "--prompt", "a"])


def _adapter_config(run) -> dict:
    return json.loads((run / "model" / "peft" / "adapter_config.json").read_text())


@pytest.mark.parametrize(
    "change, match",
    [
        ({"r": 10**8}, "r=100000000"),
        ({"target_modules": "(.*.*)*X"}, "names only"),
        ({"target_modules": ["nothing_here"]}, "names no layer"),
        ({"rank_pattern": {"(.*.*)*X": 2}}, "rank_pattern"),
        ({"lora_alpha": "big"}, "lora_alpha"),
    ],
)
def test_a_bad_adapter_config_is_one_line_before_any_allocation(run, data_dir, tmp_path, change, match):
    folder = _damaged(run, tmp_path, "peft", "adapter_config.json", {**_adapter_config(run), **change})
    start = time.monotonic()
    assert match in _refused([folder, "--prompt", "a", "--from", "adapters", "--data-dir", str(data_dir)])
    assert time.monotonic() - start < 60  # a backtracking pattern would run for minutes


@pytest.mark.parametrize(
    "name, content",
    [("adapter_config.json", b"[]"), ("adapter_config.json", b"{"), ("adapter_model.safetensors", b"\x01" * 40)],
)
def test_a_damaged_adapter_folder_is_one_line(run, data_dir, tmp_path, name, content):
    folder = _damaged(run, tmp_path, "peft", name, content)
    assert "model/peft" in _refused([folder, "--prompt", "a", "--from", "adapters", "--data-dir", str(data_dir)])
