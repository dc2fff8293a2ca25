"""Multi30K translation task on the real files: parsing, tokenizer round trips, batches, BLEU, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from collapipe_flwr.errors import DataFormatError
from collapipe_flwr.tasks import bpe_tokenizer
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.translation import read_parallel
from tests.task_specs import specs


@pytest.fixture(scope="module")
def task(data_dir, tmp_path_factory):
    return build_task(
        *specs("translation", "transformer_tiny"), data_dir, seed=0, cache_dir=tmp_path_factory.mktemp("cache")
    )


def _lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_counts_and_alignment_match_the_files(task, data_dir):
    train, val = task.train_examples(), task.val_examples()
    assert len(train) == 29000 and len(val) == 1014
    en = _lines(data_dir / "multi30k/tok/train.lc.norm.tok.en")
    de = _lines(data_dir / "multi30k/tok/train.lc.norm.tok.de")
    for i in (0, 1234, 28999):
        assert train[i].src == " ".join(en[i].split())
        assert train[i].tgt == " ".join(de[i].split())


def test_tokenizer_round_trip_and_special_ids(task):
    src_tok, tgt_tok = task.tokenizers()
    assert src_tok.get_vocab_size() <= 6000 and tgt_tok.get_vocab_size() <= 8000
    for token, expected in zip(bpe_tokenizer.SPECIALS, range(4)):
        assert src_tok.token_to_id(token) == expected == tgt_tok.token_to_id(token)
    alphabet = {c for p in task.train_examples() for c in p.tgt}
    checked = 0
    for pair in task.val_examples()[:300]:
        if set(pair.tgt) <= alphabet:
            ids = tgt_tok.encode(pair.tgt, add_special_tokens=False).ids
            assert bpe_tokenizer.UNK_ID not in ids
            assert bpe_tokenizer.decode(tgt_tok, ids) == pair.tgt
            checked += 1
    assert checked > 250
    # subwords really are sub-words: fewer tokens than characters, more than words
    ids = tgt_tok.encode(task.val_examples()[0].tgt, add_special_tokens=False).ids
    assert len(task.val_examples()[0].tgt.split()) <= len(ids) < len(task.val_examples()[0].tgt)


def test_tokenizer_is_cached_on_disk(task, data_dir, tmp_path):
    task.tokenizers()  # built on first use (not by an earlier test): this test must pass alone and in any order
    cache = task.cache_dir / "tokenizers"
    files = sorted(p.name for p in cache.glob("*.json"))
    assert len(files) == 2
    again = build_task(*specs("translation", "transformer_tiny"), data_dir, seed=0, cache_dir=task.cache_dir)
    assert again.tokenizers()[1].get_vocab() == task.tokenizers()[1].get_vocab()
    assert sorted(p.name for p in cache.glob("*.json")) == files
    smaller = {"tokenizer": {"kind": "bpe", "src_vocab_size": 3000, "tgt_vocab_size": 3000}}
    other = build_task(*specs("translation", "transformer_tiny", smaller), data_dir, seed=0, cache_dir=task.cache_dir)
    assert other.tokenizers()[1].get_vocab_size() <= 3000
    assert len(list(cache.glob("*.json"))) == 4


def test_batches_follow_the_contract(task):
    batch = next(task.batches(list(range(100)), 16, seed=0))
    assert set(batch) == {"input_ids", "attention_mask", "decoder_input_ids", "labels"}
    B = batch["input_ids"].shape[0]
    assert B == 16 and batch["labels"].shape == batch["decoder_input_ids"].shape
    assert (batch["decoder_input_ids"][:, 0] == bpe_tokenizer.BOS_ID).all()
    real = batch["labels"] != -100
    # teacher forcing: the decoder input is the label sequence shifted right by one (BOS first)
    nxt = real[:, 1:]  # position j+1 still holds a label, so label j is a target token, not EOS
    assert (batch["decoder_input_ids"][:, 1:][nxt] == batch["labels"][:, :-1][nxt]).all()
    lengths = real.sum(1)
    assert (batch["labels"][range(B), lengths - 1] == bpe_tokenizer.EOS_ID).all()
    assert (batch["decoder_input_ids"][~real] == bpe_tokenizer.PAD_ID).all()
    src_len = batch["attention_mask"].sum(1)
    assert (batch["input_ids"][range(B), src_len - 1] == bpe_tokenizer.EOS_ID).all()
    assert (batch["input_ids"][batch["attention_mask"] == 0] == bpe_tokenizer.PAD_ID).all()


def test_batches_are_a_seeded_permutation(task):
    indices = list(range(200, 300))
    first = [b["input_ids"] for b in task.batches(indices, 32, seed=5)]
    again = [b["input_ids"] for b in task.batches(indices, 32, seed=5)]
    assert all((a == b).all() for a, b in zip(first, again))
    assert sum(x.shape[0] for x in first) == 100
    assert sum(1 for _ in task.batches(indices, 32, seed=5, drop_last=True)) == 3


def test_score_of_the_references_themselves_is_bleu_100(task):
    indices = list(range(50))
    feats = task.features("val")
    assert task.score("val", indices, [feats[i]["tgt"] for i in indices])["bleu"] == pytest.approx(100.0)
    assert task.score("val", indices, [[] for _ in indices])["bleu"] == pytest.approx(0.0)


def test_misaligned_files_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_empty_line_names_file_and_line(tmp_path):
    (tmp_path / "b.en").write_text("one\n\nthree\n", encoding="utf-8")
    (tmp_path / "b.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"b\.en:2: empty line"):
        read_parallel(tmp_path / "b.en", tmp_path / "b.de")


def test_missing_file_and_unconfigured_test_split(data_dir, tmp_path):
    task = build_task(
        *specs("translation", "transformer_tiny", {"train_src": "multi30k/nope.en"}),
        data_dir,
        seed=0,
        cache_dir=tmp_path,
    )
    with pytest.raises(DataFormatError, match="nope.en does not exist"):
        task.train_examples()
    with pytest.raises(DataFormatError, match="no test split configured"):
        task.test_examples()
