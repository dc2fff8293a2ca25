"""A linear-chain conditional random field over tag sequences (Lafferty et al., 2001).

For emissions E [T, C] (per-position tag scores from the network) and a tag sequence y_1..y_T the score is

    s(y) = start[y_1] + sum_t E[t, y_t] + sum_{t>1} trans[y_{t-1}, y_t] + end[y_T],

and p(y | E) = exp s(y) / Z with Z = sum over all C^T sequences of exp s(y'). The log-partition log Z comes
from the forward algorithm and the best sequence from Viterbi, both O(T C^2). Batches are left-aligned:
``mask[b, t]`` is True for the first n_b positions of row b and False after (use :func:`pack_left` to move
labelled positions to the front). A row with n_b = 0 has log-likelihood 0 and an empty best path.
"""

from __future__ import annotations

import torch
from torch import nn


def pack_left(values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move the positions where ``keep`` [B,T] is True to the front of each row, order preserved.

    Returns (packed values [B,T,...], packed mask [B,T] bool, source index [B,T] long: packed position ->
    original position). Positions past a row's count hold arbitrary values and a False mask."""
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    index = order.view(*order.shape, *([1] * (values.dim() - 2))).expand(*order.shape, *values.shape[2:])
    packed = values.gather(1, index)
    counts = keep.sum(1)
    mask = torch.arange(keep.shape[1], device=keep.device)[None, :] < counts[:, None]
    return packed, mask, order


class LinearChainCRF(nn.Module):
    """Transition, start and end scores over ``num_tags`` tags (learned, initialised at zero)."""

    def __init__(self, num_tags: int) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))  # trans[i, j]: tag i then tag j
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))

    def sequence_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """s(y) per row [B] for tags [B,T] (values past a row's length are ignored)."""
        B, T, _ = emissions.shape
        tags = torch.where(mask, tags, torch.zeros_like(tags))
        m = mask.to(emissions.dtype)
        emit = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # [B,T]
        score = (emit * m).sum(1)
        if T > 1:
            trans = self.transitions[tags[:, :-1], tags[:, 1:]]  # [B,T-1]
            score = score + (trans * m[:, 1:]).sum(1)
        lengths = mask.sum(1)
        has = lengths > 0
        first = tags[:, 0]
        last = tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        return score + torch.where(has, self.start[first] + self.end[last], torch.zeros_like(score))

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z per row [B] by the forward algorithm (0 for an empty row)."""
        B, T, C = emissions.shape
        alpha = self.start[None, :] + emissions[:, 0]  # [B,C]
        for t in range(1, T):
            nxt = torch.logsumexp(alpha[:, :, None] + self.transitions[None] + emissions[:, t, None, :], dim=1)
            alpha = torch.where(mask[:, t, None], nxt, alpha)
        log_z = torch.logsumexp(alpha + self.end[None, :], dim=1)
        return torch.where(mask[:, 0], log_z, torch.zeros_like(log_z))

    def log_likelihood(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(y | E) = s(y) - log Z per row [B]."""
        return self.sequence_score(emissions, tags, mask) - self.log_partition(emissions, mask)

    @torch.no_grad()
    def viterbi(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """The highest-scoring tag sequence of each row (length = the row's mask count)."""
        B, T, C = emissions.shape
        score = self.start[None, :] + emissions[:, 0]
        back = []
        for t in range(1, T):
            total = score[:, :, None] + self.transitions[None]  # [B, prev, next]
            best, arg = total.max(dim=1)
            nxt = best + emissions[:, t]
            keep = mask[:, t, None]
            score = torch.where(keep, nxt, score)
            # a padded step points each tag back to itself, so backtracking walks through it unchanged
            back.append(torch.where(keep, arg, torch.arange(C, device=emissions.device)[None, :].expand(B, C)))
        score = score + self.end[None, :]
        lengths = mask.sum(1).tolist()
        pointers = torch.stack(back, dim=1).tolist() if back else [[] for _ in range(B)]  # [B][T-1][C]
        paths: list[list[int]] = []
        for b, tag in enumerate(score.argmax(1).tolist()):
            n = int(lengths[b])
            if n == 0:
                paths.append([])
                continue
            path = [tag]
            for t in range(n - 1, 0, -1):
                tag = pointers[b][t - 1][tag]
                path.append(tag)
            paths.append(path[::-1])
        return paths

    # ---- over a token-classification head's [B,T,C] logits (NER: models/bert.py, models/hf/classification_head.py)
    def token_loss_terms(self, emissions: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(negative log-likelihood of the gold tags summed over sentences, number of labelled tokens) over the
        positions with a label (labels != -100: each word's first token, not [CLS]/[SEP]/padding), packed to the
        left of each row: the scale of a per-token cross-entropy."""
        keep = labels != -100
        packed, mask, _ = pack_left(emissions, keep)
        tags, _, _ = pack_left(labels, keep)
        return -self.log_likelihood(packed, tags, mask).sum(), keep.sum()

    @torch.no_grad()
    def token_predict(
        self, emissions: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Viterbi tag per labelled token scattered back to [B,T] (0 elsewhere); without labels over every real
        token but the first and last ([CLS] and [SEP])."""
        if labels is not None:
            keep = labels != -100
        else:
            keep = attention_mask.bool().clone()
            keep[:, 0] = False
            keep[torch.arange(keep.shape[0], device=keep.device), attention_mask.sum(1) - 1] = False
        packed, mask, source = pack_left(emissions, keep)
        out = torch.zeros(keep.shape, dtype=torch.long, device=emissions.device)
        for row, path in enumerate(self.viterbi(packed, mask)):
            if path:
                out[row, source[row, : len(path)]] = torch.tensor(path, dtype=torch.long, device=emissions.device)
        return out
