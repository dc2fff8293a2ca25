"""Text from an un-split causal LM with transformers' own ``generate``: greedy or sampled, a prompt at a time.

A prompt is encoded as the causal_lm task encodes a line, ``[BOS] + its tokens`` (tasks/causal_lm.py), so the
model continues it as it learned to continue the start of a training line; generation stops at the
end-of-sequence token or after ``max_new_tokens``. Sampling draws from the temperature-scaled distribution cut
to its top-p nucleus (top-k off), seeded once before the first prompt, so a seed gives the same texts again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError

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

    def config(self, ids: dict[str, int]) -> Any:
        """The ``GenerationConfig`` of these settings and the tokenizer's special ids."""
        from transformers import GenerationConfig

        chosen: dict[str, Any] = {"do_sample": False}
        if not self.greedy:
            chosen = {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": 0}
        return GenerationConfig(max_new_tokens=self.max_new_tokens, **chosen, **ids)


def special_ids(tokenizer: Any) -> dict[str, int]:
    """bos / eos / pad ids as the causal_lm task picks them (bos and pad fall back to eos)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the model's tokenizer has no end-of-sequence token; a causal LM needs one")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return {"bos_token_id": int(bos), "eos_token_id": int(eos), "pad_token_id": int(pad)}


def prompt_ids(tokenizer: Any, prompt: str) -> torch.Tensor:
    """[1, T] ids of ``[BOS] + prompt's tokens`` (no end-of-sequence: the model goes on from there)."""
    tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    return torch.tensor([[special_ids(tokenizer)["bos_token_id"], *tokens]], dtype=torch.long)


def check_lengths(model: Any, tokenizer: Any, prompts: Sequence[str], sampling: Sampling) -> None:
    """Every prompt (with BOS) plus ``max_new_tokens`` fits the model's positions, else a one-line ConfigError."""
    limit = getattr(model.config, "max_position_embeddings", None)
    for prompt in prompts:
        length = prompt_ids(tokenizer, prompt).shape[1]
        if limit is not None and length + sampling.max_new_tokens > int(limit):
            raise ConfigError(
                f"the prompt {prompt[:40]!r} ({length} tokens with BOS) plus --max-new-tokens="
                f"{sampling.max_new_tokens} exceeds the model's {limit} positions; shorten it or ask for fewer tokens"
            )


@torch.no_grad()
def continuations(model: Any, tokenizer: Any, prompts: Sequence[str], sampling: Sampling) -> list[str]:
    """The text ``model`` generates after each prompt (the continuation alone, special tokens dropped)."""
    check_lengths(model, tokenizer, prompts, sampling)
    model.eval()
    device = next(model.parameters()).device
    config = sampling.config(special_ids(tokenizer))
    torch.manual_seed(sampling.seed)
    out = []
    for prompt in prompts:
        ids = prompt_ids(tokenizer, prompt).to(device)
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        out.append(tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True))
    return out
