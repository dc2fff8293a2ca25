"""Task metrics against hand-computed values (BLEU, entity P/R/F1, accuracy, macro-F1)."""

from __future__ import annotations

import math

import pytest

from collapipe_flwr.tasks.metrics import classification_scores, corpus_bleu, entity_scores


def test_bleu_of_identical_corpora_is_100():
    refs = ["ein mann fährt fahrrad .", "zwei hunde spielen im schnee ."]
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)


def test_bleu_of_disjoint_corpora_is_0():
    assert corpus_bleu(["aa bb cc dd ee"], ["vv ww xx yy zz"]) == pytest.approx(0.0)


def test_bleu_matches_the_formula_by_hand():
    # hyp: the cat sat on the mat / ref: the cat sat on a mat (same length: BP = 1)
    # n-gram precisions: 5/6, 3/5, 2/4, 1/3 -> BLEU = exp(mean(log p_n)) * 100
    expected = 100 * math.exp((math.log(5 / 6) + math.log(3 / 5) + math.log(2 / 4) + math.log(1 / 3)) / 4)
    assert corpus_bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected, abs=1e-6)


def test_bleu_brevity_penalty_by_hand():
    # hyp is a 4-word prefix of a 6-word ref: every precision is 1, BP = exp(1 - 6/4)
    assert corpus_bleu(["a b c d"], ["a b c d e f"]) == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-6)


def test_entity_scores_of_a_known_prediction_set():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "I-ORG", "O"]]
    # gold entities: PER(0-1), LOC(3-4), ORG(0-2) = 3; predicted: PER(0-1), LOC(3-3), ORG(0-2) = 3; correct: 2
    scores = entity_scores(gold, pred)
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)


def test_entity_scores_missed_and_spurious_entities():
    gold = [["B-PER", "I-PER", "O", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC"]]  # one correct, one spurious
    scores = entity_scores(gold, pred)
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(1.0)
    assert scores["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert entity_scores(gold, [["O"] * 4]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_entity_scores_reject_misaligned_sequences():
    with pytest.raises(ValueError):
        entity_scores([["O", "O"]], [["O"]])


def test_accuracy_and_macro_f1_by_hand():
    gold = [0, 0, 1, 1, 2]
    pred = [0, 1, 1, 1, 0]
    # class 0: P 1/2 R 1/2 F 1/2; class 1: P 2/3 R 1 F 0.8; class 2: F 0  -> macro 1.3/3
    scores = classification_scores(gold, pred)
    assert scores["accuracy"] == pytest.approx(3 / 5)
    assert scores["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
