"""Validation metrics of the three tasks (paper Section VI.A, Fig. 6 d-f).

- translation: corpus BLEU (sacrebleu) of detokenised hypotheses against one reference per sentence;
- ner: entity-level precision / recall / F1 over BIO tags (seqeval, CoNLL-style chunking);
- classification: accuracy and macro-F1 over the classes present in gold or prediction.
Pure functions over plain Python lists.
"""

from __future__ import annotations

from collections.abc import Sequence


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    """Corpus BLEU in [0, 100] with one reference per hypothesis (sacrebleu, ``tokenize`` as sacrebleu's)."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        return 0.0
    # force=True: the Multi30K tok/ references are tokenised on purpose (no "forgot to detokenize?" warning)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize, force=True).score)


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (seqeval) of BIO tag sequences, sentence by sentence."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    gold = [list(s) for s in gold]
    predicted = [list(s) for s in predicted]
    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted)):
        raise ValueError("gold and predicted tag sequences must have the same number and lengths")
    return {
        "precision": float(precision_score(gold, predicted, zero_division=0)),
        "recall": float(recall_score(gold, predicted, zero_division=0)),
        "f1": float(f1_score(gold, predicted, zero_division=0)),
    }


def classification_scores(gold: Sequence[int], predicted: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 (mean of per-class F1 over classes that occur in gold or prediction)."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels for {len(predicted)} predictions")
    if not gold:
        return {"accuracy": 0.0, "macro_f1": 0.0}
    from sklearn.metrics import f1_score

    accuracy = sum(int(g == p) for g, p in zip(gold, predicted)) / len(gold)
    macro = f1_score(list(gold), list(predicted), average="macro", zero_division=0)
    return {"accuracy": float(accuracy), "macro_f1": float(macro)}


def format_metric(name: str, value: float) -> str:
    """How a task metric is printed: ``bleu: 23.10`` / ``f1: 0.6100`` / ``accuracy: 0.7200``."""
    return f"{name}: {value:.2f}" if name == "bleu" else f"{name}: {value:.4f}"
