"""How a causal-LM example becomes token ids: the one formatting function training, evaluation and ``generate`` call.

An example is a (source, target) pair; the model sees ``prompt ids + target ids`` and learns the target alone
(tasks/causal_lm.py masks the prompt's labels with -100). :class:`PromptFormat` says how the pair is written:

- ``kind: text`` (one text a line): the prompt is ``[BOS]`` (plus the text given to ``generate``), the target is
  the line's tokens + ``[EOS]``: the causal_lm task as it always was, every token after BOS a target;
- ``kind: translation``: the prompt is ``[BOS] + "English: <source>\\nGerman:"`` (the labels configurable), the
  target is ``" <target>" + [EOS]``;
- ``chat: true`` (``translation`` only): the prompt is the tokenizer's chat template applied to one user turn
  holding that text, with the generation prompt (``tokenizer.apply_chat_template(..., add_generation_prompt=True)``);
  the target is what the template adds for the assistant's answer (the answer, its end-of-turn token).

A template whose full conversation does not start with its own generation prompt is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.errors import ConfigError


class FormatKind(StrEnum):
    """``task.format``: what one example of a causal_lm task is."""

    TEXT = "text"  # one text a line, every token a target
    TRANSLATION = "translation"  # a source / target pair, the target's tokens the only targets


def special_ids(tokenizer: Any) -> dict[str, int]:
    """bos / eos / pad ids as the causal_lm task picks them (bos and pad fall back to eos)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the model's tokenizer has no end-of-sequence token; a causal LM needs one")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return {"bos_token_id": int(bos), "eos_token_id": int(eos), "pad_token_id": int(pad)}


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


@dataclass(frozen=True)
class PromptFormat:
    """How an example (source, target) is written (module docstring); ``PromptFormat()`` is plain text."""

    kind: FormatKind = FormatKind.TEXT
    chat: bool = False
    source_label: str = "English"
    target_label: str = "German"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FormatKind(self.kind))
        if self.chat and self.kind is FormatKind.TEXT:
            raise ConfigError(
                "task.chat_template=true formats a prompt and its answer; set task.format=translation "
                "(task.format=text has no prompt)"
            )

    def prompt_text(self, source: str) -> str:
        """The text before the answer: ``source`` itself (text), ``"English: <source>\\nGerman:"`` (translation)."""
        if self.kind is FormatKind.TEXT:
            return source
        return f"{self.source_label}: {source}\n{self.target_label}:"

    def _chat(self, tokenizer: Any, source: str, target: str | None) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "task.chat_template=true but the model's tokenizer has no chat template; set task.chat_template=false"
            )
        turns = [{"role": "user", "content": self.prompt_text(source)}]
        if target is None:
            return str(tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False))
        turns.append({"role": "assistant", "content": target})
        return str(tokenizer.apply_chat_template(turns, tokenize=False))

    def prompt_ids(self, tokenizer: Any, source: str) -> list[int]:
        """The ids the model continues from: what training puts before the target, what ``generate`` feeds."""
        if self.chat:
            return _tokens(tokenizer, self._chat(tokenizer, source, None))
        return [special_ids(tokenizer)["bos_token_id"], *_tokens(tokenizer, self.prompt_text(source))]

    def example_ids(self, tokenizer: Any, source: str, target: str) -> tuple[list[int], list[int]]:
        """(prompt ids, target ids) of one training / evaluation example; the target's ids are the only targets."""
        prompt = self.prompt_ids(tokenizer, source)
        eos = special_ids(tokenizer)["eos_token_id"]
        if not self.chat:
            text = target if self.kind is FormatKind.TEXT else f" {target}"
            return prompt, [*_tokens(tokenizer, text), eos]
        full = _tokens(tokenizer, self._chat(tokenizer, source, target))
        if full[: len(prompt)] != prompt:
            raise ConfigError(
                "the tokenizer's chat template does not write the answer after its own generation prompt; "
                "set task.chat_template=false"
            )
        answer = full[len(prompt) :]
        if eos in answer:  # what a template adds after the end-of-turn token is never generated: not a target
            answer = answer[: len(answer) - answer[::-1].index(eos)]
        return prompt, answer

    def stop_ids(self, tokenizer: Any) -> list[int]:
        """Tokens besides end-of-sequence that end a generated answer: a translation's newline (one line), if the
        tokenizer writes ``"\\n"`` as one token."""
        if self.kind is FormatKind.TEXT:
            return []
        newline = _tokens(tokenizer, "\n")
        return newline if len(newline) == 1 else []

    def answer(self, text: str) -> str:
        """A generated continuation as the answer: text as it is; a translation's first line, stripped."""
        if self.kind is FormatKind.TEXT:
            return text
        return text.strip().split("\n", 1)[0].strip() if text.strip() else ""

    def describe(self) -> str:
        if self.kind is FormatKind.TEXT:
            return "plain text after BOS"
        how = "in the tokenizer's chat template" if self.chat else "after BOS"
        return f'"{self.source_label}: <source>\\n{self.target_label}:" {how}'
