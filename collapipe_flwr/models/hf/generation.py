"""Text from an un-split causal LM with transformers' own ``generate``: greedy or sampled, a prompt (or a batch of
prompts, padded on the left) at a time.

A prompt is encoded by the formatting the causal_lm task trains with (models/hf/prompting.py): plain text as a
line, ``[BOS] + its tokens``, so the model continues it as it learned to continue the start of a training line;
a translation run's source as ``[BOS] + "English: <source>\\nGerman:"`` (or in the chat template). Generation
stops at the end-of-sequence token (a translation's also at a newline token) or after ``max_new_tokens``.
Sampling draws from the temperature-scaled distribution cut to its top-p nucleus (top-k off), seeded once before
the first prompt, so a seed gives the same texts again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.prompting import PromptFormat, special_ids

PLAIN = PromptFormat()  # one text a line: [BOS] + the prompt's tokens

# --temperature: logits / T stay finite in fp32 (a logit of 100 / 1e-3 = 1e5); above 1e3 sampling is uniform
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3
MAX_SEED = 2**64 - 1  # torch.manual_seed's range


@dataclass(frozen=True)
class Sampling:
    """How to pick each new token: ``greedy`` (the argmax) or sampled at ``temperature`` within the top-p nucleus."""

    max_new_tokens: int = 20
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens={self.max_new_tokens} must be an integer >= 1")
        if not (math.isfinite(self.temperature) and MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise ConfigError(
                f"--temperature={self.temperature} must be a number from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g} "
                "(below it the scaled logits overflow); --greedy picks the most likely token"
            )
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"--top-p={self.top_p} must be a number in (0, 1]")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed={self.seed} must be an integer from 0 to 2^64 - 1 (what torch's seed takes)")

    def describe(self) -> str:
        how = (
            "greedy"
            if self.greedy
            else f"sampled (temperature {self.temperature}, top-p {self.top_p}, seed {self.seed})"
        )
        return f"{how}, at most {self.max_new_tokens} new tokens"

    def config(self, ids: dict[str, Any]) -> Any:
        """The ``GenerationConfig`` of these settings and the tokenizer's special ids (``eos_token_id``: one id or a
        list of the ids that stop)."""
        from transformers import GenerationConfig

        chosen: dict[str, Any] = {"do_sample": False}
        if not self.greedy:
            chosen = {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": 0}
        return GenerationConfig(max_new_tokens=self.max_new_tokens, **chosen, **ids)


def prompt_ids(tokenizer: Any, prompt: str, fmt: PromptFormat = PLAIN) -> torch.Tensor:
    """[1, T] ids of the prompt as ``fmt`` writes it (plain: ``[BOS] + prompt's tokens``; no end-of-sequence: the
    model goes on from there)."""
    return torch.tensor([fmt.prompt_ids(tokenizer, prompt)], dtype=torch.long)


def check_lengths(
    model: Any, tokenizer: Any, prompts: Sequence[str], sampling: Sampling, fmt: PromptFormat = PLAIN
) -> None:
    """Every prompt (with BOS) plus ``max_new_tokens`` fits the model's positions, else a one-line ConfigError."""
    limit = getattr(model.config, "max_position_embeddings", None)
    for prompt in prompts:
        length = prompt_ids(tokenizer, prompt, fmt).shape[1]
        if limit is not None and length + sampling.max_new_tokens > int(limit):
            raise ConfigError(
                f"the prompt {prompt[:40]!r} ({length} tokens with BOS) plus --max-new-tokens="
                f"{sampling.max_new_tokens} exceeds the model's {limit} positions; shorten it or ask for fewer tokens"
            )


def _left_padded(rows: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] ids padded on the left with ``pad``, the [B, T] attention mask), so every row ends where it goes on."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


@torch.no_grad()
def continuations(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    sampling: Sampling,
    fmt: PromptFormat = PLAIN,
    batch_size: int = 1,
) -> list[str]:
    """The text ``model`` generates after each prompt written as ``fmt`` writes it (the continuation alone, special
    tokens dropped; a translation's answer: its first line, generation stopping at a newline token too).
    ``batch_size`` prompts at a time, padded on the left and masked (1, the default: each prompt alone)."""
    check_lengths(model, tokenizer, prompts, sampling, fmt)
    model.eval()
    device = next(model.parameters()).device
    ids = special_ids(tokenizer)
    stops = [ids["eos_token_id"], *fmt.stop_ids(tokenizer)]
    config = sampling.config({**ids, "eos_token_id": stops[0] if len(stops) == 1 else stops})
    torch.manual_seed(sampling.seed)
    out = []
    for start in range(0, len(prompts), max(1, batch_size)):
        rows = [fmt.prompt_ids(tokenizer, p) for p in prompts[start : start + max(1, batch_size)]]
        tokens, mask = _left_padded(rows, ids["pad_token_id"])
        generated = model.generate(tokens.to(device), attention_mask=mask.to(device), generation_config=config)
        for row in generated[:, tokens.shape[1] :]:
            out.append(fmt.answer(tokenizer.decode(row, skip_special_tokens=True)))
    return out
