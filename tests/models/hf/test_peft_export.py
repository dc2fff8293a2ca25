"""Adapters out in PEFT's own format, the merged export and generation from a saved run (issue 46).

References independent of the code under test: ``peft.PeftModel.from_pretrained`` on the un-split Hugging Face
model loaded by transformers from the base folder, perplexity recomputed here from its logits, the merged
folder loaded by ``AutoModelForCausalLM.from_pretrained`` alone, and transformers' own ``generate``. The bases
are tiny Llama and GPT-2 folders written with ``save_pretrained`` (the tokenizer: the byte-level BPE the task
trains on the Multi30K English side); the Llama one is fine-tuned by a real federated run (one round, two local
steps, LoRA on), the GPT-2 ones (a folder and a from-scratch config) by a few steps of the split model saved
as train_central saves it. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import subprocess
import sys

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from collapipe_flwr.apps import evaluate, generate
from collapipe_flwr.config import compose
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.model_store import load_model, save_model
from collapipe_flwr.models.hf import load_hf_model
from collapipe_flwr.models.hf_arch import inline_config
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.spec import parse_model, parse_task
from tests.inprocess_grid import InProcessGrid

# peft's from_pretrained asks transformers a deprecated question; not this project's to answer
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
VAL = 48  # validation lines compared
LLAMA = {"hidden": 64, "n_heads": 2, "d_ff": 172, "layers": 4, "max_len": 64}  # conf/model/llama_tiny.yaml
GPT2 = {"hidden": 64, "n_heads": 2, "d_ff": 256, "layers": 4, "max_len": 64}  # conf/model/gpt2_tiny.yaml
QUIET = (
    "federation=tiny network=small federation.num_rounds=1 federation.local_steps=2 runtime.backend=local "
    "runtime.precision=fp32 task.batch_size=16 eval.max_examples=32"
)


def _task(cfg, data_dir, cache):
    task_spec = parse_task(cfg["task"])
    return build_task(task_spec, parse_model(cfg["model"], task_spec), data_dir, seed=0, cache_dir=cache)


def _base_folder(model_type, sizes, tied, data_dir, cache, folder):
    """A model folder as a user has one: save_pretrained weights + the task's byte-level BPE tokenizer."""
    inline = _task(compose(["task=causal_lm"]), data_dir, cache)
    tokenizer = inline.tokenizer()
    config = inline_config(model_type, sizes, len(tokenizer), 0.0, inline.special_ids(), tied)
    torch.manual_seed(1)
    load_hf_model(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _trained_and_saved(cfg, data_dir, cache, out, steps=3):
    """A few Adam steps of the split model on training batches, saved as train_central --save saves it."""
    cfg = {**cfg, "data_dir": str(data_dir), "seed": 0}
    task = _task(cfg, data_dir, cache)
    model = task.build_model(seed=0)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.02)
    for step in range(steps):
        loss_sum, count = model.loss_terms(task.collate(task.features("train")[8 * step : 8 * step + 8]))
        (loss_sum / count).backward()
        opt.step()
        opt.zero_grad()
    save_model(out, cfg, *model.parts(), task=task)
    return out


@pytest.fixture(scope="module")
def runs(data_dir, cache, tmp_path_factory):
    """name -> (run folder, base folder or None): a federated Llama run on a folder, GPT-2 on a folder and from
    scratch trained directly."""
    root = tmp_path_factory.mktemp("peft")
    llama = _base_folder("llama", LLAMA, False, data_dir, cache, root / "llama-base")
    gpt2 = _base_folder("gpt2", GPT2, True, data_dir, cache, root / "gpt2-base")
    overrides = f"task=causal_lm model=llama_tiny model.hf_folder={llama} {QUIET} run_name=llama"
    with contextlib.redirect_stderr(io.StringIO()):
        run = run_server(
            InProcessGrid(2, str(data_dir)),
            {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(root)},
        )
    folder_cfg = compose(["task=causal_lm", "model=gpt2_tiny", f"model.hf_folder={gpt2}"])
    scratch_cfg = compose(["task=causal_lm", "model=gpt2_tiny"])
    return {
        "llama": (run, llama),
        "gpt2": (_trained_and_saved(folder_cfg, data_dir, cache, root / "gpt2"), gpt2),
        "scratch": (_trained_and_saved(scratch_cfg, data_dir, cache, root / "scratch"), None),
    }


def _perplexity(net, task) -> float:
    """exp(mean next-token NLL) of the un-split model over the first VAL validation lines, computed here."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, VAL, 16):
            batch = task.collate(task.features("val")[start : start + 16])
            logits = net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            nll += float(F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100, reduction="sum"))
            count += int((targets != -100).sum())
    return math.exp(nll / count)


def _project_perplexity(run) -> float:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return evaluate.main([str(run), "--max-examples", str(VAL), "--samples", "0"])["perplexity"]


def _peft_model(run, base):
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), run / "model" / "peft").eval()


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_adapters_reload_through_peft_with_the_runs_perplexity(runs, name):
    run, base = runs[name]
    adapters = load_file(str(run / "model" / "peft" / "adapter_model.safetensors"))
    layers = "model.layers" if name == "llama" else "transformer.h"
    first = f"base_model.model.{layers}.0.{'self_attn.q_proj' if name == 'llama' else 'attn.c_attn'}.lora_A.weight"
    assert first in adapters and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in adapters)
    assert any(float(t.abs().max()) > 0 for k, t in adapters.items() if "lora_B" in k)  # it trained
    config = json.loads((run / "model" / "peft" / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and config["peft_type"] == "LORA" and config["r"] == 4
    assert config["base_model_name_or_path"] == str((run / "model" / "base").resolve())  # the run's own base
    _, task, _ = load_model(run)
    peft = _peft_model(run, base)
    assert _perplexity(peft, task) == pytest.approx(_project_perplexity(run), rel=1e-4)
    assert _perplexity(AutoModelForCausalLM.from_pretrained(base), task) != pytest.approx(_perplexity(peft, task))


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["llama", "gpt2", "scratch"])
def test_the_merged_folder_loads_alone_with_base_plus_adapters_logits(runs, name, tmp_path):
    run, base = runs[name]
    merged_dir = run / "model" / "merged"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in merged_dir.iterdir()}
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    ids = tokenizer(["a man rides a bike", "two dogs play"], padding=True, return_tensors="pt")
    with torch.no_grad():
        got = merged(**ids).logits
        if base is None:  # from scratch: the split model the saved config rebuilds, the project's own forward
            _, _, split = load_model(run)
            want = split.head.logits(split.encode(ids["input_ids"], ids["attention_mask"]))
        else:
            want = _peft_model(run, base)(**ids).logits
    mask = ids["attention_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-4, atol=1e-4)


def _generate(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        texts = generate.main(argv)
    return texts, out.getvalue()


@pytest.mark.e2e
@pytest.mark.parametrize("source", ["merged", "adapters"])
def test_greedy_generation_equals_transformers_generate_on_the_peft_model(runs, source):
    run, base = runs["llama"]
    prompts = ["a man", "two young"]
    texts, printed = _generate([str(run), "--prompt", prompts[0], "--prompt", prompts[1], "--from", source])
    peft = _peft_model(run, base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    want = []
    for prompt in prompts:
        ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]])
        out = peft.generate(input_ids=ids, max_new_tokens=20, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        want.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    assert texts == want and printed.splitlines() == want and all(want)


@pytest.mark.e2e
def test_sampling_follows_the_seed_and_a_scratch_base_loads_with_adapters(runs, data_dir):
    run, _ = runs["scratch"]
    args = [str(run), "--prompt", "a dog", "--temperature", "1.5", "--top-p", "0.9", "--max-new-tokens", "8"]
    first, _ = _generate([*args, "--seed", "3"])
    assert _generate([*args, "--seed", "3"])[0] == first
    assert _generate([*args, "--seed", "3", "--from", "adapters", "--data-dir", str(data_dir)])[0] == first
    greedy, _ = _generate([str(run), "--prompt", "a dog", "--max-new-tokens", "8", "--from", "adapters"])
    assert greedy == _generate([str(run), "--prompt", "a dog", "--max-new-tokens", "8"])[0]


@pytest.mark.e2e
def test_evaluate_prints_generated_samples_beside_perplexity(runs):
    run, _ = runs["gpt2"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        evaluate.main([str(run), "--max-examples", "16"])
    samples = [line for line in err.getvalue().splitlines() if line.startswith("sample: ")]
    assert len(samples) == 3 and out.getvalue().strip().splitlines()[-1].startswith("perplexity: ")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args,match",
    [
        (["{missing}", "--prompt", "a"], "does not exist"),
        (["{translation}", "--prompt", "a"], "generate needs a causal_lm run"),
        (["{run}", "--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens=0"),
        (["{run}", "--prompt", "a", "--max-new-tokens", "ten"], "invalid int value"),
        (["{run}", "--prompt", "a", "--temperature", "0"], "--temperature=0.0"),
        (["{run}", "--prompt", "a", "--top-p", "1.5"], "--top-p=1.5"),
        (["{run}", "--prompt", "a", "--greedy", "--temperature", "1"], "not allowed with"),
        (["{run}"], "--prompt"),
        (["{run}", "--prompt", "a", "--max-new-tokens", "500"], "positions"),
    ],
)
def test_bad_generate_inputs_are_one_line_and_exit_2(runs, tmp_path, args, match):
    translation = tmp_path / "translation" / "model"
    translation.mkdir(parents=True)
    (translation / "model.json").write_text(
        json.dumps({"format": 1, "config": {"task": {"name": "translation"}, "model": {}}})
    )
    where = {"missing": tmp_path / "nothing", "translation": translation.parent, "run": runs["scratch"][0]}
    argv = [a.format(**where) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        generate.main(argv)
    assert done.value.code == 2
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("error: ") and match in err.getvalue()
    assert out.getvalue() == ""


@pytest.mark.e2e
def test_the_command_line_refuses_a_missing_folder_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "collapipe_flwr.apps.generate", str(tmp_path / "nothing"), "--prompt", "a"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "does not exist" in done.stderr


def test_a_full_disk_while_exporting_is_one_line_and_keeps_the_previous_export(data_dir, cache, tmp_path, monkeypatch):
    cfg = compose(["task=causal_lm", "model=gpt2_tiny"])
    run = _trained_and_saved(cfg, data_dir, cache, tmp_path / "run", steps=1)
    before = (run / "model" / "merged" / "model.safetensors").read_bytes()
    base_before = (run / "model" / "base" / "model.safetensors").read_bytes()

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(CollaPipeError, match="No space left on device") as err:
        _trained_and_saved(cfg, data_dir, cache, tmp_path / "run", steps=1)
    assert "\n" not in str(err.value) and "model/base" in str(err.value)  # the first folder save_pretrained writes
    assert (run / "model" / "merged" / "model.safetensors").read_bytes() == before
    assert (run / "model" / "base" / "model.safetensors").read_bytes() == base_before
    assert not [p.name for p in (run / "model").iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_trained_head_is_not_exported_and_generate_says_why(data_dir, cache, tmp_path):
    cfg = compose(["task=causal_lm", "model=gpt2_tiny", "model.lora.train_head=true"])
    run = _trained_and_saved(cfg, data_dir, cache, tmp_path / "run", steps=1)
    meta = json.loads((run / "model" / "model.json").read_text())
    assert "train_head" in meta["exports"]["skipped"] and not (run / "model" / "peft").exists()
    err = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(err):
        generate.main([str(run), "--prompt", "a"])
    assert done.value.code == 2 and err.getvalue().count("\n") == 1 and "train_head" in err.getvalue()
