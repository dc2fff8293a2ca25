"""People's Daily NER on the real files: parsing, character tokenisation, label alignment, F1, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from seqeval.metrics.sequence_labeling import get_entities

from collapipe_flwr.errors import DataFormatError
from collapipe_flwr.tasks.ner import LABELS, read_bio, word_tags
from collapipe_flwr.tasks.registry import build_task
from tests.task_specs import specs


@pytest.fixture(scope="module")
def task(data_dir):
    return build_task(*specs("ner", "bert_tiny", {"max_len": 128}), data_dir, seed=0)


def _independent_counts(path: Path):
    """Sentences and tag counts straight from the text (blank-line separated blocks)."""
    blocks = [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    tags = Counter(line.split(" ")[-1] for b in blocks for line in b.splitlines() if line.strip())
    return len(blocks), tags


def test_counts_and_label_set_match_the_files(task, data_dir):
    for split, examples in (("train", task.train_examples()), ("val", task.val_examples())):
        n, tags = _independent_counts(data_dir / f"chinese_ner/{split}.txt")
        assert len(examples) == n
        ours = Counter(t for s in examples for t in s.tags)
        assert ours == tags
        assert set(ours) == set(LABELS)
    assert len(task.train_examples()) == 4000 and len(task.val_examples()) == 618
    assert all(len(s.chars) == len(s.tags) for s in task.train_examples())


def test_upstream_label_ids():
    assert LABELS == ("O", "B-ORG", "B-LOC", "B-PER", "I-ORG", "I-LOC", "I-PER")


def test_character_tokenisation_round_trip(task):
    tok = task.tokenizer()
    vocab = tok.get_vocab()
    checked = 0
    for sentence, feat in zip(task.val_examples()[:200], task.features("val")[:200]):
        chars = [c.lower() for c in sentence.chars]
        if len(chars) > task.max_len - 2 or not all(c in vocab for c in chars):
            continue
        tokens = tok.convert_ids_to_tokens(feat["input_ids"])
        assert tokens == ["[CLS]"] + chars + ["[SEP]"]
        checked += 1
    assert checked > 100


def test_every_entity_survives_label_alignment(task):
    lost = 0
    for split in ("train", "val"):
        for sentence, feat in zip(task.examples(split), task.features(split)):
            labels = feat["labels"]
            assert labels[0] == -100 and labels[-1] == -100  # [CLS], [SEP]
            real = [l for l in labels if l != -100]
            kept = min(len(sentence.chars), task.max_len - 2)
            assert len(real) <= kept
            back = word_tags(feat["word_ids"], [max(l, 0) for l in labels], len(sentence.chars))
            gold = [e for e in get_entities(list(sentence.tags)) if e[2] < kept]
            got = [e for e in get_entities(back) if e[2] < kept]
            if len(sentence.chars) <= task.max_len - 2:
                lost += len(set(gold) - set(got))
            else:
                assert set(gold) <= set(get_entities(back)) | {e for e in gold if e[2] >= kept - 1}
    assert lost == 0


def test_padding_gets_ignore_index(task):
    batch = next(task.batches(list(range(64)), 16, seed=0))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["labels"].shape == batch["input_ids"].shape
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()
    assert (batch["labels"][:, 0] == -100).all()
    assert (batch["input_ids"][:, 0] == task.tokenizer().cls_token_id).all()


def test_score_of_gold_tags_is_perfect_and_truncation_is_not_flattering(data_dir):
    task = build_task(*specs("ner", "bert_tiny", {"max_len": 32}), data_dir, seed=0)
    indices = list(range(len(task.val_examples())))
    gold_tokens = [[max(l, 0) for l in f["labels"]] for f in task.features("val")]
    scores = task.score("val", indices, gold_tokens)
    # reference: the predicted tags are the gold tags of the first 30 characters, then O
    gold_set, pred_set = set(), set()
    for n, s in enumerate(task.val_examples()):
        gold_set |= {(n, *e) for e in get_entities(list(s.tags))}
        pred_set |= {(n, *e) for e in get_entities(list(s.tags[:30]) + ["O"] * (len(s.tags) - 30))}
    assert len(pred_set) < len(gold_set)  # entities past 30 characters were cut off: missed, not ignored
    assert scores["precision"] == pytest.approx(len(gold_set & pred_set) / len(pred_set))
    assert scores["recall"] == pytest.approx(len(gold_set & pred_set) / len(gold_set))
    short = [i for i, s in enumerate(task.val_examples()) if len(s.chars) <= 30]
    assert task.score("val", short, [gold_tokens[i] for i in short])["f1"] == pytest.approx(1.0)


def test_line_without_tag_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("在 O\n这 O\n\n北 B-LOC\n京\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.txt:5: expected 'char<SPACE>tag'"):
        read_bio(bad)


def test_unknown_tag_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("北 B-LOC\n京 I-GPE\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.txt:2: unknown tag 'I-GPE'"):
        read_bio(bad)


def test_label_skew_for_ner_uses_each_sentences_dominant_entity_type(data_dir):
    from collections import Counter

    from collapipe_flwr.errors import ConfigError

    task = build_task(
        *specs("ner", "bert_tiny", {"partition": "pathological", "classes_per_partition": 1}), data_dir, seed=0
    )
    labels = task.partition_labels()
    sentences = task.train_examples()
    for sentence, label in list(zip(sentences, labels))[:300]:  # the label by hand: most tagged characters
        counts = Counter(tag[2:] for tag in sentence.tags if tag != "O")
        names = sorted({tag[2:] for s in sentences for tag in s.tags if tag != "O"})
        expected = names.index(min(counts, key=lambda t: (-counts[t], t))) if counts else len(names)
        assert label == expected
    parts = [task.partition(4, pid) for pid in range(4)]  # 4 labels (LOC, ORG, PER, none), one per cluster
    assert [len({labels[i] for i in p}) for p in parts] == [1, 1, 1, 1]
    assert sorted(i for p in parts for i in p) == list(range(len(sentences)))
    with pytest.raises(ConfigError, match="task.partition=domain needs a second training corpus"):  # at start-up
        build_task(*specs("ner", "bert_tiny", {"partition": "domain"}), data_dir, seed=0).partition(2, 0)
