"""A causal LM fine-tuned as a translator (``task.format=translation``) and the chat-template option (issue 66).

References independent of the code under test: the prompt and target built here by hand from the tokenizer
(``"English: <src>\\nGerman:"``, ``tokenizer.apply_chat_template``), sacrebleu called directly on the hypotheses,
and the ids transformers' ``generate`` receives. Tiny from-scratch Llama models (the byte-level BPE trained on
both sides of Multi30K), a federated run (one round, two local steps) and ``train_central``; nothing downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import sacrebleu
import torch
from transformers import LlamaForCausalLM

from collapipe_flwr.apps import generate, train_central
from collapipe_flwr.config import compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.models.hf import generation
from collapipe_flwr.tasks import lm_translation
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.spec import parse_model, parse_task
from tests.inprocess_grid import InProcessGrid
from tests.models.hf.test_peft_export import LLAMA, QUIET, _base_folder, _trained_and_saved

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
MT = [
    "task=causal_lm",
    "model=llama_tiny",
    "task.format=translation",
    "task.max_len=63",
    "task.translation.bleu_examples=6",
    "task.translation.max_new_tokens=6",
    "task.translation.generate_batch=4",
]
# a ChatML-like template, as SmolLM2's (no system turn): user turn, assistant turn, each closed by the eos token
TEMPLATE = (
    "{% for m in messages %}{{ '<|endoftext|>' + m['role'] + '\\n' + m['content'] + '<|endoftext|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|endoftext|>assistant\\n' }}{% endif %}"
)


def _task(overrides, data_dir, cache):
    cfg = compose(overrides)
    spec = parse_task(cfg["task"])
    return build_task(spec, parse_model(cfg["model"], spec), data_dir, seed=0, cache_dir=cache)


def _tokens(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_prompt_is_masked_and_only_the_target_is_learned(data_dir, cache):
    task = _task(MT, data_dir, cache)
    tokenizer, pair = task.tokenizer(), task.val_examples()[0]
    assert pair.src == "A group of men are loading cotton onto a truck"  # the raw cased file's first line
    prompt = [tokenizer.bos_token_id, *_tokens(tokenizer, f"English: {pair.src}\nGerman:")]
    target = [*_tokens(tokenizer, f" {pair.tgt}"), tokenizer.eos_token_id]
    feature = task.features("val")[0]
    assert feature["ids"] == prompt + target
    assert feature["labels"] == [-100] * len(prompt) + target
    batch = task.collate(task.features("val")[:3])
    row = batch["labels"][0].tolist()
    assert row[: len(prompt) + len(target)] == feature["labels"] and set(row[len(prompt) + len(target) :]) <= {-100}
    # the loss the server's head computes is the cross-entropy of the target tokens alone
    model = task.build_model(seed=0)
    loss_sum, count = model.loss_terms(task.collate([feature]))
    assert int(count) == len(target)


def test_bleu_is_sacrebleu_on_the_greedy_first_lines(data_dir, cache, monkeypatch):
    task = _task(MT, data_dir, cache)
    pairs = task.val_examples()[:6]
    made = {}
    real = generation.continuations

    def recorded(*args, **kwargs):
        made["texts"] = real(*args, **kwargs)
        return made["texts"]

    monkeypatch.setattr(generation, "continuations", recorded)
    metrics = task.evaluate(task.build_model(seed=0), max_examples=8)
    refs = [p.tgt for p in pairs]
    assert metrics["bleu_examples"] == 6 and len(made["texts"]) == 6 and all("\n" not in t for t in made["texts"])
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(made["texts"], [refs], tokenize="13a").score)
    # and with known hypotheses: half the references verbatim
    half = [r if i % 2 == 0 else "Ein Hund." for i, r in enumerate(refs)]
    monkeypatch.setattr(generation, "continuations", lambda *a, **k: half)
    assert lm_translation.bleu_of(task.build_model(0), task.tokenizer(), pairs, task.options)["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(half, [refs]).score
    )


@pytest.mark.parametrize(
    "override, match",
    [
        ("task.format=transl", "task.format='transl' must be one of text, translation"),
        ("task.chat_template=yes", "task.chat_template='yes' must be true or false"),
        ("task.translation.bleu_tokenize=spm", "must be one of 13a, intl, none, char"),
        ("task.translation.generate_batch=0", "task.translation.generate_batch=0 must be >= 1"),
    ],
)
def test_a_wrong_format_option_is_refused_at_start_up_with_its_choices(override, match):
    with pytest.raises(ConfigError, match=match):
        parse_task(compose(["task=causal_lm", "model=llama_tiny", override])["task"])


def test_the_chat_template_needs_a_pair():
    with pytest.raises(ConfigError, match="set task.format=translation"):
        parse_task(compose(["task=causal_lm", "model=llama_tiny", "task.chat_template=true"])["task"])


@pytest.fixture(scope="module")
def chat_run(data_dir, cache, tmp_path_factory):
    """A tiny Llama folder whose tokenizer carries a chat template, a few steps of translation with it, saved."""
    root = tmp_path_factory.mktemp("chat")
    folder = _base_folder("llama", LLAMA, False, data_dir, cache, root / "base")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    overrides = [*MT, f"model.hf_folder={folder}", "task.chat_template=true", "task.translation.generate_batch=1"]
    return _trained_and_saved(compose(overrides), data_dir, cache, root / "run", steps=1), overrides


def test_training_evaluation_and_generate_write_one_example_alike(chat_run, data_dir, cache, monkeypatch):
    run, overrides = chat_run
    task = _task(overrides, data_dir, cache)
    tokenizer, pair = task.tokenizer(), task.val_examples()[0]
    turn = [{"role": "user", "content": f"English: {pair.src}\nGerman:"}]
    by_hand = _tokens(tokenizer, tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False))
    feature = task.features("val")[0]
    trained = [i for i, label in zip(feature["ids"], feature["labels"]) if label == -100]
    fed: list[list[int]] = []
    real = LlamaForCausalLM.generate

    def seen(self, input_ids, attention_mask=None, **kwargs):
        fed.append(input_ids[0][attention_mask[0].bool()].tolist())
        return real(self, input_ids, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "generate", seen)
    task.evaluate(task.build_model(seed=0), max_examples=2)  # BLEU: the first source is the first one generated
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        generate.main([str(run), "--prompt", pair.src, "--max-new-tokens", "3"])
    assert by_hand == trained == fed[0] == fed[-1] and len(fed) == 7
    answer = _tokens(tokenizer, f"{pair.tgt}<|endoftext|>")  # the answer and its eos, cut at task.max_len
    assert feature["ids"][len(trained) :] == answer[: len(feature["ids"]) - len(trained)]


@pytest.fixture(scope="module")
def federated(data_dir, cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    overrides = " ".join([*MT, QUIET, "run_name=mt"])
    with contextlib.redirect_stderr(io.StringIO()):
        return run_server(
            InProcessGrid(2, str(data_dir)),
            {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(root)},
        )


@pytest.mark.e2e
def test_a_federated_run_reports_bleu_and_generate_translates_as_it_trained(federated):
    rounds = [json.loads(line) for line in (federated / "rounds.jsonl").read_text().splitlines() if line.strip()]
    last = rounds[-1]
    assert 0.0 <= last["val_bleu"] <= 100.0 and last["val_bleu_examples"] == 6 and last["val_perplexity"] > 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        texts = generate.main([str(federated), "--prompt", "A dog runs.", "--max-new-tokens", "6"])
    assert len(texts) == 1 and "\n" not in texts[0]


def test_central_training_reports_bleu(data_dir, cache, tmp_path):
    out = tmp_path / "central.json"
    argv = [*MT, f"data_dir={data_dir}", "--max-steps", "2", "--quiet", "--json", str(out)]
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train_central.main(argv)
    val = json.loads(out.read_text())["val"]
    assert 0.0 <= val["bleu"] <= 100.0 and val["bleu_examples"] == 6
