"""Adapters that load anywhere and adapters per round (issue 66).

A federated LoRA run (tiny Llama, three rounds, frozen base in bf16) on a base shipped inside an installed Python
package (``model.hf_folder: package:<module>``, models/packaged.py; here a package written for the test whose
folder is a plain Hugging Face model) exports ``model/peft``. References independent of the code under test:
peft's own ``AutoPeftModelForCausalLM.from_pretrained(folder)``, which follows ``adapter_config.json`` alone; the
merged folder loaded by transformers alone; ``PeftModel.from_pretrained`` over the base folder; the adapter tensors
read with safetensors. Each is checked with the package findable and with it gone (``find_spec`` answers None, as
on a machine holding only the run folder), and on a copy of the run folder moved elsewhere. Nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import sys

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from collapipe_flwr.apps import generate
from collapipe_flwr.config import build_run_config, compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.round_exports import RoundAdapterExport
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.models import packaged
from tests.inprocess_grid import InProcessGrid
from tests.models.hf.test_peft_export import LLAMA, _base_folder

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
PACKAGE = "collapipe_issue66_base"  # a package of this test's own: its folder is the base model
ROUNDS = (
    "federation=tiny network=small federation.num_rounds=3 federation.local_steps=2 runtime.backend=local "
    "runtime.precision=fp32 task.batch_size=16 eval.max_examples=16 +model.base_dtype=bf16 round_adapters.keep=2"
)
PROMPTS = ["a man", "two young"]


@pytest.fixture(scope="module")
def run(data_dir, cache, tmp_path_factory):
    """The run folder of three federated rounds on ``package:collapipe_issue66_base`` (its adapters kept for the
    last two rounds)."""
    root = tmp_path_factory.mktemp("issue66")
    package = root / "site" / PACKAGE
    _base_folder("llama", LLAMA, False, data_dir, cache, package)
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(root / "site"))
    try:
        overrides = f"task=causal_lm model=llama_tiny model.hf_folder=package:{PACKAGE} {ROUNDS} run_name=run"
        with contextlib.redirect_stderr(io.StringIO()):
            folder = run_server(
                InProcessGrid(2, str(data_dir)),
                {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(root)},
            )
        yield folder
    finally:
        sys.path.remove(str(root / "site"))


@pytest.fixture(params=["package found", "package gone"])
def where(request, run, monkeypatch):
    """The run with its base package findable, or not (``find_spec`` answers None for it: only the run folder)."""
    if request.param == "package gone":
        real = importlib.util.find_spec
        monkeypatch.setattr(
            packaged.importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a)
        )
        with pytest.raises(ConfigError, match=f"needs the Python package {PACKAGE}"):
            packaged.resolve_folder(f"package:{PACKAGE}")
    return run


def _ids(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer(["a man rides a bike", "two dogs play in the snow"], padding=True, return_tensors="pt")


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(**ids).logits[ids["attention_mask"].bool()]


def _generate(argv) -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return generate.main(argv)


def _reference_texts(model, tokenizer) -> list[str]:
    """Greedy continuations of PROMPTS by transformers' own ``generate`` ([BOS] + the prompt's tokens)."""
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]])
        done = model.generate(input_ids=ids, max_new_tokens=20, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        out.append(tokenizer.decode(done[0, ids.shape[1] :], skip_special_tokens=True))
    return out


# ----------------------------------------------------------------------------- adapters that load anywhere
@pytest.mark.e2e
def test_peft_alone_loads_the_adapters_with_the_merged_logits(where):
    model_dir = where / "model"
    config = json.loads((model_dir / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((model_dir / "base").resolve())  # a folder, not package:...
    assert "package:" not in config["base_model_name_or_path"] and PACKAGE not in config["base_model_name_or_path"]
    pointer = json.loads((model_dir / "peft" / "base_model.json").read_text())
    assert pointer["base_model"] == "../base" and pointer["trained_from"] == f"package:{PACKAGE}"  # portable
    peft = AutoPeftModelForCausalLM.from_pretrained(str(model_dir / "peft")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(model_dir / "merged")).eval()
    ids = _ids(model_dir / "merged")
    torch.testing.assert_close(_logits(peft, ids), _logits(merged, ids), rtol=1e-4, atol=1e-4)
    with peft.disable_adapter():  # the adapters change the model: the comparison above can fail
        assert not torch.allclose(_logits(peft, ids), _logits(merged, ids), atol=1e-3)


@pytest.mark.e2e
def test_the_base_keeps_the_bf16_weights_the_run_trained_over(run):
    """model/base holds the TEBs' frozen weights in bf16 as the run stored them (fp32 config: read back in fp32),
    not the package's fp32 originals: base + adapters equal the merged model exactly, not merely close."""
    base = run / "model" / "base"
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "BF16" and dtypes["model.norm.weight"] == "F32"
    assert json.loads((base / "config.json").read_text())["dtype"] == "float32"
    original = load_file(str(run.parent / "site" / PACKAGE / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
    stored = load_file(str(base / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(stored, original.to(torch.bfloat16)) and not torch.equal(stored.float(), original)


@pytest.mark.e2e
def test_generate_from_adapters_equals_transformers_generate_on_peft(where):
    peft = AutoPeftModelForCausalLM.from_pretrained(str(where / "model" / "peft")).eval()
    want = _reference_texts(peft, AutoTokenizer.from_pretrained(where / "model" / "base"))
    args = [str(where), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]
    assert _generate([*args, "--from", "adapters"]) == want == _generate(args)
    model, _ = generate.load_adapters(where / "model" / "peft", where / "model", "")  # what generate loaded
    ids = _ids(where / "model" / "base")
    torch.testing.assert_close(_logits(model.eval(), ids), _logits(peft, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_a_moved_run_folder_alone_loads_its_adapters(run, tmp_path, monkeypatch):
    """A copy of the run moved elsewhere, its first place gone and the package gone: generate --from adapters
    follows base_model.json (relative) and gives the merged model's texts; peft over the moved base agrees."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        packaged.importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a)
    )
    first = shutil.copytree(run, tmp_path / "first")
    moved = shutil.move(str(first), str(tmp_path / "moved"))
    assert not first.exists()
    args = [moved, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]
    texts = _generate([*args, "--from", "adapters"])
    base = AutoModelForCausalLM.from_pretrained(f"{moved}/model/base")
    peft = PeftModel.from_pretrained(base, f"{moved}/model/peft").eval()
    assert texts == _reference_texts(peft, AutoTokenizer.from_pretrained(f"{moved}/model/base")) == _generate(args)


@pytest.mark.e2e
def test_a_missing_base_folder_is_one_line(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "copy")
    shutil.rmtree(copy / "model" / "base")
    err = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        generate.main([str(copy), "--prompt", "a", "--from", "adapters"])
    assert done.value.code == 2 and err.getvalue().count("\n") == 1 and "model/base" in err.getvalue()


# ----------------------------------------------------------------------------- adapters per round
def _adapters(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.e2e
def test_each_round_keeps_its_adapters_and_only_the_newest_stay(run):
    rounds = run / "model" / "rounds"
    assert sorted(p.name for p in rounds.iterdir()) == ["2", "3"]  # round_adapters.keep=2: round 1 removed
    final, third, second = (
        _adapters(p) for p in (run / "model" / "peft", rounds / "3" / "peft", rounds / "2" / "peft")
    )
    assert set(final) == set(second) and all(torch.equal(final[k], third[k]) for k in final)  # the last = final
    assert any(not torch.equal(final[k], second[k]) for k in final)  # round 2's differ: round 3 trained on
    pointer = json.loads((rounds / "2" / "peft" / "base_model.json").read_text())
    assert pointer["base_model"] == "../../../base"


@pytest.mark.e2e
def test_generate_round_reads_that_rounds_adapters(where):
    peft = AutoPeftModelForCausalLM.from_pretrained(str(where / "model" / "rounds" / "2" / "peft")).eval()
    final = AutoPeftModelForCausalLM.from_pretrained(str(where / "model" / "peft")).eval()
    ids = _ids(where / "model" / "base")
    assert not torch.allclose(_logits(peft, ids), _logits(final, ids), atol=1e-4)
    model, _ = generate.load_adapters(where / "model" / "rounds" / "2" / "peft", where / "model", "")
    torch.testing.assert_close(_logits(model.eval(), ids), _logits(peft, ids), rtol=1e-5, atol=1e-5)
    want = _reference_texts(peft, AutoTokenizer.from_pretrained(where / "model" / "base"))
    assert _generate([str(where), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--round", "2"]) == want


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, match",
    [(["--round", "1"], "no adapters of round 1 (rounds kept: 2, 3)"), (["--round", "2", "--from", "merged"], "drop")],
)
def test_a_round_not_kept_is_one_line(run, args, match):
    err = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        generate.main([str(run), "--prompt", "a", *args])
    assert done.value.code == 2 and err.getvalue().count("\n") == 1 and match in err.getvalue()


@pytest.mark.e2e
def test_a_resumed_run_drops_the_rounds_it_trains_again(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "copy")
    cfg = build_run_config(compose(["task=causal_lm", "model=llama_tiny", "round_adapters.keep=2"]))
    export = RoundAdapterExport.of(cfg, copy, done=2)
    assert export is not None and sorted(p.name for p in (copy / "model" / "rounds").iterdir()) == ["2"]


def test_round_adapters_settings_are_checked_once_at_start_up():
    for bad, match in [("every=-1", "round_adapters.every=-1 must be >= 0"), ("keep=x", "round_adapters.keep='x'")]:
        with pytest.raises(ConfigError, match=match) as err:
            build_run_config(compose(["task=causal_lm", "model=llama_tiny", f"round_adapters.{bad}"]))
        assert "\n" not in str(err.value)
    default = build_run_config(compose(["task=causal_lm", "model=llama_tiny"]))
    assert "round_adapters" not in default.to_dict()  # an earlier run's config.json still resumes
    changed = build_run_config(compose(["task=causal_lm", "model=llama_tiny", "round_adapters.every=0"]))
    assert changed.to_dict()["round_adapters"] == {"every": 0, "keep": 5}
    assert RoundAdapterExport.of(changed, ".") is None
    assert RoundAdapterExport.of(build_run_config(compose(["task=translation"])), ".") is None
