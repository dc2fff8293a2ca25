"""Subword tokenizers for translation, trained offline with Hugging Face ``tokenizers`` and cached.

One tokenizer per language side, trained on that side of the training split only. Text is split on
spaces with the Metaspace pre-tokenizer (a space becomes the word-start marker), so decoding gives back
exactly the (NFKC-normalised, single-spaced) input text for every character seen in training:
``decode(encode(s)) == s``. Special ids
are fixed: [PAD]=0, [UNK]=1, [BOS]=2, [EOS]=3 (the same pad id on both sides).

The cache file name is a hash of the training file's content and the settings, so a changed file or
setting trains a new tokenizer; files are written atomically (several CUs may build at once).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from collapipe_flwr.errors import ConfigError

SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)
MODELS = ("bpe", "wordpiece")


def settings_key(kind: str, vocab_size: int, min_frequency: int, lowercase: bool) -> dict:
    if kind not in MODELS:
        raise ConfigError(f"task.tokenizer.kind={kind!r} is not one of {', '.join(MODELS)}")
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIALS) + 1:
        raise ConfigError(f"tokenizer vocab size {vocab_size!r} must be an integer > {len(SPECIALS) + 1}")
    return {
        "kind": kind,
        "vocab_size": vocab_size,
        "min_frequency": int(min_frequency),
        "lowercase": bool(lowercase),
        "v": 1,
    }


def train_tokenizer(lines: Sequence[str], kind: str, vocab_size: int, min_frequency: int = 2, lowercase: bool = False):
    """A ``tokenizers.Tokenizer`` trained on ``lines`` (BPE or WordPiece under Metaspace)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    settings_key(kind, vocab_size, min_frequency, lowercase)
    trainer: trainers.Trainer
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
        )
    norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
    tok.normalizer = normalizers.Sequence(norms)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(list(lines), trainer=trainer)
    for expected, token in enumerate(SPECIALS):
        if tok.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, expected {expected}")
    return tok


def cached_tokenizer(cache_dir: Path, tag: str, source: Path, lines: Sequence[str], **settings):
    """Load the tokenizer for (``source`` content, settings) from ``cache_dir``, training it if absent."""
    from tokenizers import Tokenizer

    key = settings_key(**settings)
    digest = hashlib.sha256(Path(source).read_bytes() + json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "tokenizers" / f"{tag}-{digest}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = train_tokenizer(lines, **settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        tok.save(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise ConfigError(
            f"cannot write the tokenizer cache {path}: {err.strerror}; "
            "set task.cache_dir or COLLAPIPE_CACHE_DIR to a writable folder"
        ) from None
    return tok


def decode(tok, ids: Sequence[int]) -> str:
    """Token ids -> text, dropping special tokens (the inverse of the subword split)."""
    return tok.decode([int(i) for i in ids], skip_special_tokens=True)
