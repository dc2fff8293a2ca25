"""The bert-base-chinese WordPiece vocabulary as a ``BertTokenizerFast`` (offline, from vocab.txt).

Chinese characters are single tokens; [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102 in the shipped vocab.
"""

from __future__ import annotations

import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from collapipe_flwr.errors import DataFormatError
from collapipe_flwr.tasks.data_files import resolve_file

VOCAB_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # the lines every vocab.txt holds


def bert_tokenizer(data_dir: Path | str, vocab_file: str):
    """BertTokenizerFast over ``vocab_file`` (relative to ``data_dir``), lower-casing like bert-base-chinese."""
    path = resolve_file(data_dir, vocab_file, "BERT vocabulary (vocab.txt)")
    stat = path.stat()
    return _load(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4)
def _load(path: str, size: int, mtime_ns: int):
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # transformers 5: a lazy alias

    with tempfile.TemporaryDirectory() as folder:
        # from_pretrained reads a folder; give it one that holds only this vocab.txt (no network access).
        shutil.copyfile(path, Path(folder) / "vocab.txt")
        try:
            tok = BertTokenizerFast.from_pretrained(folder, local_files_only=True, do_lower_case=True)
        except (OSError, ValueError) as err:
            raise DataFormatError(
                f"cannot read {path} as a BERT vocab.txt ({err}); expected one WordPiece token a line"
            ) from None
    for special in VOCAB_SPECIALS:
        if tok.convert_tokens_to_ids(special) in (None, tok.unk_token_id) and special != "[UNK]":
            raise DataFormatError(f"{path} has no {special} token; expected the bert-base-chinese vocab.txt")
    return tok
