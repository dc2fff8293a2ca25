"""Toutiao classification on the real files: parsing, tokenisation, batches, partitions, errors."""

from __future__ import annotations

from collections import Counter

import pytest

from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks.classification import read_titles
from collapipe_flwr.tasks.registry import TASKS, build_task
from collapipe_flwr.tasks.spec import parse_model, parse_task
from tests.conf_files import conf_group as _cfg
from tests.task_specs import specs


def validate_task_config(task_cfg, model_cfg):
    parse_model(model_cfg, parse_task(task_cfg))


@pytest.fixture(scope="module")
def task(data_dir):
    return build_task(*specs("classification", "bert_tiny"), data_dir, seed=0)


def test_counts_and_label_set_match_the_files(task, data_dir):
    for split, examples in (("train", task.train_examples()), ("val", task.val_examples())):
        lines = (data_dir / f"toutiao/{split}.txt").read_text(encoding="utf-8").splitlines()
        assert len(examples) == len(lines)
        assert Counter(t.label for t in examples) == Counter(int(l.split("_!_")[1]) for l in lines)
    assert len(task.train_examples()) == 24000 and len(task.val_examples()) == 4000
    assert {t.label for t in task.train_examples()} == set(range(15))
    assert Counter(t.label for t in task.train_examples())[12] == 21


def test_tokenisation_round_trip(task):
    tok = task.tokenizer()
    vocab = tok.get_vocab()
    checked = 0
    for title, feat in zip(task.val_examples()[:1000], task.features("val")[:1000]):
        chars = list(title.text)
        if len(chars) > task.max_len - 2 or not all("\u4e00" <= c <= "\u9fff" and c in vocab for c in chars):
            continue
        assert tok.convert_ids_to_tokens(feat["input_ids"]) == ["[CLS]"] + chars + ["[SEP]"]
        checked += 1
    assert checked >= 10
    assert all(len(f["input_ids"]) <= task.max_len for f in task.features("train"))


def test_batches_carry_sentence_labels(task):
    indices = list(range(40))
    seen = []
    for batch in task.batches(indices, 16, seed=1):
        assert batch["labels"].shape == (batch["input_ids"].shape[0],)
        assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
        seen.extend(batch["labels"].tolist())
    assert Counter(seen) == Counter(task.train_examples()[i].label for i in indices)


def test_dirichlet_partition_of_the_real_labels(data_dir):
    task = build_task(*specs("classification", "bert_tiny", {"partition": "dirichlet", "alpha": 0.3}), data_dir, seed=0)
    parts = [task.partition(3, pid) for pid in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(24000))
    assert parts[1] == task.partition(3, 1)
    iid = build_task(*specs("classification", "bert_tiny"), data_dir, seed=0)
    iid_parts = [iid.partition(3, pid) for pid in range(3)]
    assert sorted(i for p in iid_parts for i in p) == list(range(24000))
    assert {len(p) for p in iid_parts} == {8000}


def test_domain_partition_gives_toutiao_and_tnews_their_own_clusters(data_dir):
    extra = {
        "partition": "domain",
        "extra_train_files": ["toutiao/supplementary_tnews_fewclue/tnews_fewclue_labeled.txt"],
    }
    task = build_task(*specs("classification", "bert_tiny", extra), data_dir, seed=0)
    parts = [task.partition(3, pid) for pid in range(3)]
    # Toutiao's 24000 titles first, then TNEWS's: clusters 0 and 2 share Toutiao, cluster 1 reads TNEWS alone
    assert sorted(parts[1]) == list(range(24000, len(task.train_examples())))
    assert all(i < 24000 for i in parts[0] + parts[2]) and {len(parts[0]), len(parts[2])} == {12000}
    # TNEWS keeps min(1000, 10%) of its titles out of training as its own validation; Toutiao keeps its val file
    tnews = read_titles(data_dir / extra["extra_train_files"][0])
    held = task.examples("val_domain1")
    assert task.domain_validation_splits() == ["val_domain1"]
    assert len(held) == min(1000, len(tnews) // 10) and len(task.train_examples()) == 24000 + len(tnews) - len(held)
    assert Counter(task.train_examples()[24000:] + held) == Counter(tnews)  # disjoint, and nothing lost
    again = build_task(*specs("classification", "bert_tiny", extra), data_dir, seed=5)
    assert again.examples("val_domain1") == held  # the same held-out titles whatever the run's seed
    iid = build_task(*specs("classification", "bert_tiny", {**extra, "partition": "iid"}), data_dir, seed=0)
    assert iid.domain_validation_splits() == [] and len(iid.train_examples()) == 24000 + len(tnews)
    with pytest.raises(ConfigError, match="val_domain2.*partition=domain"):
        task.examples("val_domain2")


def test_malformed_lines_name_file_and_line(tmp_path):
    bad = tmp_path / "t.txt"
    bad.write_text("好标题_!_3\n没有分隔符 5\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"t\.txt:2: no '_!_' separator"):
        read_titles(bad)
    bad.write_text("好标题_!_3\n\n另一个_!_15\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"t\.txt:3: unknown label id '15'"):
        read_titles(bad)
    bad.write_text("好标题_!_x\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="unknown label id 'x'"):
        read_titles(bad)
    bad.write_bytes("好标题_!_3\n".encode() + b"\x00" * 100_000 + b"_!_4\n")  # 100 kB of NUL bytes
    with pytest.raises(DataFormatError, match=r"t\.txt:2: control character '\\x00' \(binary data"):
        read_titles(bad)


def test_registry_and_config_validation():
    assert set(TASKS) == {"translation", "ner", "classification", "causal_lm"}
    validate_task_config(_cfg("task", "classification"), _cfg("model", "bert_small"))
    with pytest.raises(ConfigError, match="model.family='transformer' cannot run task 'classification'"):
        validate_task_config(_cfg("task", "classification"), _cfg("model", "transformer_small"))
    with pytest.raises(ConfigError, match="unknown config key task.batchsize"):
        validate_task_config(_cfg("task", "classification", batchsize=3), _cfg("model", "bert_small"))
    with pytest.raises(ConfigError, match="task.batch_size=0"):
        validate_task_config(_cfg("task", "classification", batch_size=0), _cfg("model", "bert_small"))
    with pytest.raises(ConfigError, match="task.name='poetry' is not a known task"):
        validate_task_config({"name": "poetry"}, _cfg("model", "bert_small"))
    with pytest.raises(ConfigError, match="model.max_len=16"):
        validate_task_config(_cfg("task", "classification"), _cfg("model", "bert_small", max_len=16))
    with pytest.raises(ConfigError, match="optimizer"):
        validate_task_config(
            _cfg("task", "classification"), _cfg("model", "bert_small", optimizer={"name": "lamb", "lr": 1.0})
        )


@pytest.mark.parametrize("model", ["transformer_tiny", "transformer_small", "transformer_paper"])
def test_every_transformer_preset_is_valid(model):
    validate_task_config(_cfg("task", "translation"), _cfg("model", model))


@pytest.mark.parametrize("model", ["bert_tiny", "bert_small", "bert_base"])
def test_every_bert_preset_is_valid(model):
    validate_task_config(_cfg("task", "ner"), _cfg("model", model))
    validate_task_config(_cfg("task", "classification"), _cfg("model", model))
