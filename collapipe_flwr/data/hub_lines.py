"""Hugging Face Hub records -> the lines of the layout's files (docs/data.md); pure functions, tested offline."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from collapipe_flwr.errors import DataFormatError
from collapipe_flwr.tasks.classification import SEPARATOR, TOUTIAO_CODES
from collapipe_flwr.tasks.ner import LABEL_IDS


def parallel_lines(rows: Iterable[Mapping[str, Any]], src: str, tgt: str) -> tuple[list[str], list[str]]:
    """Hub translation records -> the aligned lines of the source and target files (whitespace normalised,
    pairs with an empty side dropped so the files stay line-aligned)."""
    src_lines, tgt_lines = [], []
    for row in rows:
        s, t = " ".join(str(row[src] or "").split()), " ".join(str(row[tgt] or "").split())
        if s and t:
            src_lines.append(s)
            tgt_lines.append(t)
    return src_lines, tgt_lines


def moses_lines(lines: Iterable[str], normalize: Callable[[str], str], tokenize: Callable[[str], str]) -> list[str]:
    """Raw sentences -> the official ``lc.norm.tok`` form: lower-case, normalise punctuation, tokenise
    (``normalize``/``tokenize``: sacremoses' MosesPunctNormalizer.normalize / MosesTokenizer.tokenize)."""
    return [" ".join(tokenize(normalize(line.lower())).split()) for line in lines]


def moses_steps(moses: Any, lang: str) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """sacremoses' punctuation normaliser and tokeniser (escaping ' as &apos; like the official files)."""
    normalizer, tokenizer = moses.MosesPunctNormalizer(lang=lang), moses.MosesTokenizer(lang=lang)

    def tokenize(text: str) -> str:
        return tokenizer.tokenize(text, return_str=True, escape=True)

    return normalizer.normalize, tokenize


def bio_lines(rows: Iterable[Mapping[str, Any]], tag_names: Sequence[str]) -> list[str]:
    """Hub NER records (``tokens``, ``ner_tags`` as ClassLabel ids) -> ``char<SPACE>tag`` lines, a blank line
    after each sentence. Whitespace tokens are dropped (they cannot be written as ``char tag``)."""
    for tag in tag_names:
        if tag not in LABEL_IDS:
            raise DataFormatError(f"NER tag {tag!r} of the Hub dataset is not one of {', '.join(LABEL_IDS)}")
    lines: list[str] = []
    for row in rows:
        pairs = [(str(char), tag_names[int(tag)]) for char, tag in zip(row["tokens"], row["ner_tags"])]
        pairs = [(char, tag) for char, tag in pairs if char.strip()]
        if pairs:
            lines.extend(f"{char.strip()} {tag}" for char, tag in pairs)
            lines.append("")
    return lines


def title_lines(
    rows: Iterable[Mapping[str, Any]], label_names: Sequence[str], codes: Sequence[int] = TOUTIAO_CODES
) -> list[str]:
    """Hub TNEWS records (``sentence``, ``label`` a ClassLabel whose names are the Toutiao codes "100".."116")
    -> ``title_!_labelid`` lines with ids 0..14 (docs/data.md); unlabelled rows (label -1) are dropped."""
    code_to_id = {int(code): i for i, code in enumerate(codes)}
    lines = []
    for row in rows:
        label = int(row["label"])
        if label < 0:
            continue
        code = int(label_names[label])
        if code not in code_to_id:
            raise DataFormatError(f"TNEWS label code {code} is not a Toutiao class ({', '.join(map(str, codes))})")
        title = " ".join(str(row["sentence"] or "").split())
        if title:
            lines.append(f"{title}{SEPARATOR}{code_to_id[code]}")
    return lines
