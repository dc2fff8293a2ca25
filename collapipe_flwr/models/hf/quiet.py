"""transformers' progress bars and library warnings off while a model or tokenizer loads (one place, so that the
loaders and the GGUF cache, models/hf/gguf_cache.py, keep a run's log to one line per event)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars (a GGUF file's "Converting and de-quantizing", "Loading weights") and library
    warnings off for a while, so a run's log keeps one line per event (process-wide settings, restored after)."""
    from transformers.utils import logging as hf_logging

    level, shown = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if shown:
            hf_logging.enable_progress_bar()
