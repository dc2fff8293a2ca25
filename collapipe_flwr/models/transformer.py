"""The classic Transformer encoder-decoder for translation, split CollaPipe-style.

- embedding (CU): source token embedding * sqrt(d) + sinusoidal positions + dropout;
- L encoder blocks (TEBs, devices): ``torch.nn.TransformerEncoderLayer`` (pre-LN, batch_first);
- head (server): final encoder LayerNorm + decoder stack + generator (Linear to the target vocabulary)
  + its own target embedding (shared-nothing with the source side).

Every block is called as ``block(hidden [B,T,d], attention_mask [B,T] long, 1 = real token)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.decoder_cache import DecoderCache
from collapipe_flwr.models.fast_dropout import with_fast_dropout
from collapipe_flwr.models.split import SplitModel, TaskHead


@dataclass(frozen=True)
class TransformerConfig:
    """The translation model's sizes (paper: 6 + 6 blocks) and its loss options, checked when built.

    ``src_vocab`` / ``tgt_vocab``, ``pad_id`` and ``label_smoothing`` come from the task, the rest from the
    model spec (tasks/model_config.py); ``tie_embeddings`` shares the generator with the target embedding."""

    src_vocab: int
    tgt_vocab: int
    d_model: int
    n_heads: int
    d_ff: int
    enc_layers: int
    dec_layers: int
    dropout: float
    max_len: int
    pad_id: int
    label_smoothing: float = 0.0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "enc_layers", "dec_layers", "max_len"):
            value = getattr(self, name)
            if int(value) < 1:
                raise ConfigError(f"model.{name}={value} must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; pick n_heads "
                "dividing d_model"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"task.label_smoothing={self.label_smoothing} must be in [0, 1)")


def sinusoidal_positions(max_len: int, d_model: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...) (Vaswani et al.), shape [max_len, d]."""
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
    return pe.float()


class TokenEmbedding(nn.Module):
    """tokens -> embedding * sqrt(d) + positions, then dropout.

    Token vectors start as N(0, 1/d) so that, after the sqrt(d) scale, tokens and the sinusoidal positions
    have the same (unit) scale; torch's default N(0, 1) would make the tokens sqrt(d) times larger and
    drown the positions."""

    positions: torch.Tensor  # [max_len, d_model] sinusoidal table, a non-persistent buffer

    def __init__(self, vocab_size: int, d_model: int, max_len: int, dropout: float, pad_id: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.tokens.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.tokens.weight[pad_id].zero_()
        self.register_buffer("positions", sinusoidal_positions(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Embed ``input_ids`` [B,T] at positions start .. start+T-1 (start > 0: incremental decoding)."""
        end = start + input_ids.shape[1]
        if end > self.max_len:
            raise ConfigError(
                f"sequence length {end} exceeds the model's max_len={self.max_len}; raise model.max_len or truncate "
                "the data"
            )
        x = self.tokens(input_ids) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions[start:end].to(x.dtype))


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B,T] 1 = real token  ->  key padding mask [B,T] bool, True = ignore (torch.nn convention)."""
    return attention_mask == 0


class EncoderBlock(nn.Module):
    """One TEB: pre-LN self-attention + feed-forward (``nn.TransformerEncoderLayer``)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.hidden_size, self.ffn_size, self.num_heads = d_model, d_ff, n_heads
        self.layer = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout=dropout, batch_first=True, norm_first=True
        )

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, src_key_padding_mask=padding_mask(attention_mask))


def causal_mask(T: int, device=None) -> torch.Tensor:
    """[T,T] bool, True above the diagonal (a target position may not attend to later ones)."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


class TranslationHead(TaskHead):
    """Server side: encoder LayerNorm, target embedding, decoder stack, generator (ServerHead)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = config
        self.pad_id = c.pad_id
        self.label_smoothing = float(c.label_smoothing)
        self.memory_norm = nn.LayerNorm(c.d_model)
        self.tgt_embedding = TokenEmbedding(c.tgt_vocab, c.d_model, c.max_len, c.dropout, c.pad_id)
        layer = nn.TransformerDecoderLayer(
            c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, c.dec_layers, norm=nn.LayerNorm(c.d_model))
        self.generator = nn.Linear(c.d_model, c.tgt_vocab)
        if c.tie_embeddings:  # Press & Wolf (2017): the generator shares the target embedding matrix
            self.generator.weight = self.tgt_embedding.tokens.weight

    def decoded(self, memory: torch.Tensor, memory_mask: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """The decoder stack's teacher-forced output [B,T',d] for targets ``decoder_input_ids`` (BOS + target)."""
        T = decoder_input_ids.shape[1]
        tgt = self.tgt_embedding(decoder_input_ids)
        return self.decoder(
            tgt,
            self.memory_norm(memory),
            tgt_mask=causal_mask(T, tgt.device),
            tgt_key_padding_mask=decoder_input_ids == self.pad_id,
            memory_key_padding_mask=padding_mask(memory_mask),
            tgt_is_causal=True,
        )

    def logits(self, memory: torch.Tensor, memory_mask: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B,T',V] for targets ``decoder_input_ids`` (BOS + target)."""
        return self.generator(self.decoded(memory, memory_mask, decoder_input_ids))

    def loss_terms(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token cross-entropies over labels != -100, number of such tokens).

        In training mode the cross-entropy is label-smoothed by ``label_smoothing`` (epsilon of Szegedy et
        al., as in Vaswani et al.); in eval mode it is the plain cross-entropy, so validation losses compare.
        The generator runs on the target positions only (labels != -100): padding positions add nothing to the
        loss or to any gradient, and skipping them saves the largest matmul of the step (the vocabulary
        projection) on the padded ~18% of a Multi30K batch."""
        out = self.decoded(hidden, attention_mask, batch["decoder_input_ids"])
        labels = batch["labels"]
        targets = labels != -100
        smoothing = self.label_smoothing if self.training else 0.0
        loss_sum = F.cross_entropy(
            self.generator(out[targets]), labels[targets], reduction="sum", label_smoothing=smoothing
        )
        return loss_sum, targets.sum()

    def predict(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """Teacher-forced argmax next tokens [B,T']."""
        return self.logits(hidden, attention_mask, batch["decoder_input_ids"]).argmax(-1)

    def _next_log_probs(self, memory: torch.Tensor, memory_mask: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """log p(next token | prefix) with padding and BOS (prefix[:, 0]) never chosen (set to -inf)."""
        return self._decoding_log_probs(self.logits(memory, memory_mask, prefix)[:, -1], int(prefix[0, 0]))

    def _decoding_log_probs(self, logits: torch.Tensor, bos_id: int) -> torch.Tensor:
        """log-softmax of next-token logits [B,V] with padding and BOS set to -inf (never emitted)."""
        logp = F.log_softmax(logits.float(), dim=-1)
        logp[:, self.pad_id] = -math.inf
        logp[:, bos_id] = -math.inf
        return logp

    def _incremental_logits(self, token: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """Logits [B,V] of the next token after appending ``token`` [B] at the next position (``cache.length``).

        The same computation as :meth:`logits` on the whole prefix, restricted to the last position (valid
        because the decoder is causal): ``cache`` (models/decoder_cache.py) holds each layer's self-attention
        keys and values of the earlier positions and its cross-attention keys and values of the memory, so a
        step projects one position only. Eval mode only (dropout off)."""
        x = self.tgt_embedding(token[:, None], start=cache.length)
        norm = self.decoder.norm
        if norm is None:  # unreachable: __init__ builds the decoder with its final LayerNorm
            raise ValueError("incremental decoding needs the decoder's final LayerNorm")
        return self.generator(norm(cache.step(x)))[:, 0]

    @torch.no_grad()
    def greedy_decode(
        self, memory: torch.Tensor, memory_mask: torch.Tensor, max_len: int, bos_id: int, eos_id: int
    ) -> list[list[int]]:
        """Batched greedy decoding; per sentence the token ids after BOS up to (not including) EOS.

        In eval mode it decodes incrementally (:meth:`_incremental_logits`, a cache of the decoder's
        keys and values); in train mode (dropout on) it re-runs :meth:`logits` on the whole prefix."""
        B = memory.shape[0]
        prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=memory.device)
        done = torch.zeros(B, dtype=torch.bool, device=memory.device)
        incremental = not self.training
        if incremental:
            cache = DecoderCache(self.decoder.layers, self.memory_norm(memory), padding_mask(memory_mask))
        for _ in range(max_len):
            if incremental:
                logits = self._incremental_logits(prefix[:, -1], cache)
                nxt = self._decoding_log_probs(logits, bos_id).argmax(-1)
            else:
                nxt = self._next_log_probs(memory, memory_mask, prefix).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            prefix = torch.cat([prefix, nxt[:, None]], dim=1)
            done |= nxt == eos_id
            if bool(done.all()):
                break
        return [_strip(row[1:].tolist(), eos_id, self.pad_id) for row in prefix]

    @torch.no_grad()
    def beam_decode(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        max_len: int,
        bos_id: int,
        eos_id: int,
        beam_size: int,
        length_penalty: float = 1.0,
    ) -> list[list[int]]:
        """Beam search per sentence. A finished hypothesis y scores sum log p(y_t) / len(y)^length_penalty
        (len counts EOS); a hypothesis still open at max_len is scored the same way without EOS."""
        if beam_size < 1:
            raise ConfigError(f"beam_size={beam_size} must be >= 1")
        return [
            self._beam_one(
                memory[i : i + 1], memory_mask[i : i + 1], max_len, bos_id, eos_id, beam_size, length_penalty
            )
            for i in range(memory.shape[0])
        ]

    def _beam_one(self, memory, memory_mask, max_len, bos_id, eos_id, beam_size, alpha) -> list[int]:
        def score(logp: float, length: int) -> float:
            return logp / (max(length, 1) ** alpha)

        beams = [([bos_id], 0.0)]
        finished: list[tuple[list[int], float]] = []
        for _ in range(max_len):
            prefix = torch.tensor([b[0] for b in beams], dtype=torch.long, device=memory.device)
            logp = self._next_log_probs(memory.expand(len(beams), -1, -1), memory_mask.expand(len(beams), -1), prefix)
            total = torch.tensor([b[1] for b in beams], dtype=logp.dtype, device=logp.device)[:, None] + logp
            k = min(beam_size * 2, total.numel())
            top_vals, top_idx = total.flatten().topk(k)
            V = logp.shape[-1]
            new_beams = []
            for val, idx in zip(top_vals.tolist(), top_idx.tolist()):
                src, tok = divmod(idx, V)
                seq = beams[src][0] + [tok]
                if tok == eos_id:
                    finished.append((seq[1:], score(val, len(seq) - 1)))
                else:
                    new_beams.append((seq, val))
                if len(new_beams) == beam_size:
                    break
            beams = new_beams
            if not beams:
                break
            best_open_bound = max(b[1] for b in beams)  # log-probs only fall as a hypothesis grows
            if finished and alpha == 0 and max(f[1] for f in finished) >= best_open_bound:
                break
        for seq, val in beams:
            finished.append((seq[1:], score(val, len(seq) - 1)))
        best = max(finished, key=lambda f: f[1])[0]
        return _strip(best, eos_id, self.pad_id)


def _strip(tokens: list[int], eos_id: int, pad_id: int) -> list[int]:
    out = []
    for t in tokens:
        if t == eos_id or t == pad_id:
            break
        out.append(t)
    return out


def build_transformer(config: TransformerConfig) -> SplitModel:
    """The translation model (paper: 6 + 6 blocks), random init, sizes from ``config`` (checked when it was made)."""
    c = config
    embedding = TokenEmbedding(c.src_vocab, c.d_model, c.max_len, c.dropout, c.pad_id)
    blocks = nn.ModuleList(EncoderBlock(c.d_model, c.n_heads, c.d_ff, c.dropout) for _ in range(c.enc_layers))
    head = TranslationHead(config)
    return with_fast_dropout(SplitModel(embedding=embedding, blocks=blocks, head=head, family="transformer"))
