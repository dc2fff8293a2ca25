"""The server's part of ``round_adapters`` (config/round_adapters.py): the global model's adapters in PEFT's format
after the rounds it names, in ``<run>/model/rounds/<t>/peft`` (models/hf/round_adapters.py).

Round t's folder is written when the round closes, before its checkpoint (fl/records/round_ledger.py), so a run
killed in between trains round t again on resume and replaces the folder; a resumed run first drops the folders
of the rounds after the one it resumes from. Only a LoRA causal LM whose head is frozen has adapters in PEFT's
format (model_store.peft_settings); for every other run :meth:`RoundAdapterExport.of` is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapipe_flwr.config import RunConfig
from collapipe_flwr.model_store import MODEL_DIR, describe_tokenizer, peft_settings


class RoundAdapterExport:
    """Writes round t's adapters when ``round_adapters`` asks for them and keeps the newest ``keep``."""

    def __init__(self, cfg: RunConfig, folder: Path, done: int = 0) -> None:
        from collapipe_flwr.models.hf.round_adapters import drop_after

        self.cfg = cfg
        self.model_dir = Path(folder) / MODEL_DIR
        self.raw = cfg.to_dict()
        drop_after(self.model_dir, done)  # a resumed run trains the rounds after ``done`` again

    @classmethod
    def of(cls, cfg: RunConfig, folder: Path, done: int = 0) -> RoundAdapterExport | None:
        """The export of a LoRA causal-LM run with ``round_adapters.every`` > 0; None for any other run."""
        if cfg.round_adapters.every == 0 or cfg.task.name != "causal_lm" or cfg.model.hf is None:
            return None
        lora = cfg.model.hf.lora
        return cls(cfg, folder, done) if lora.enabled and not lora.train_head else None

    def after_round(self, t: int, server: Any) -> Path | None:
        """Round t's adapters from ``server``'s global model when round t is due; None when it is not."""
        from collapipe_flwr.models.hf.round_adapters import keep_newest, write_round

        spec = self.cfg.round_adapters
        if not spec.due(t, self.cfg.federation.num_rounds):
            return None
        parts = server.model.parts()
        settings, _ = peft_settings(self.raw, parts[1])
        if settings is None:
            return None
        if not (self.model_dir / "tokenizer").is_dir():
            describe_tokenizer(server.task, self.model_dir)  # the base's tokenizer files (model_store's own copy)
        hf = self.cfg.model.hf
        source, gguf_file = (hf.hf_folder, hf.gguf_file) if hf is not None else ("", "")
        folder = write_round(self.model_dir, t, parts, settings, source, gguf_file)
        keep_newest(self.model_dir, spec.keep)
        return folder
