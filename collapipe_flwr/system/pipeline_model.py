"""Pipeline-parallel delay and energy inside one cluster, paper Section III.D (eqs. 15-16) and eq. (26).

Reading chosen (docs/system_model.md explains why):
* one chunk of stage k = forward + backward of one micro-batch on its delta_k blocks plus its D2D
  hand-off: ``chunk_k = delta_k * b_hat * (o_l + o'_l) / (phi_k f_k(t)) + c0 + tau_k^dd`` with o_l, o'_l the
  per-sample forward/backward FLOPs of one TEB, b_hat = ceil(b/m) the largest micro-batch and c0 the fixed
  per-micro-batch cost of a stage (network.device.per_microbatch_s; 0 gives eq. 15 as printed);
* a GPipe round of S stages and m micro-batches lasts (S + m - 1) clocks of the slowest chunk
  (eq. 15). Every selected device hands its output on over D2D (the last one to its CU, which relays
  z_enc to the server), so no hop is subtracted and the delay does not depend on the device order,
  as footnote 1 of the paper requires;
* device energy (eq. 16 with the CMOS constant kappa): ``E_k = m (kappa * cycles * f_k^2 + p_k tau_k^dd)``
  with cycles = delta_k b_hat (o_l + o'_l) / phi_k: m chunks, each one forward and one backward;
* with re-materialization (``pipeline.checkpoint``) the backward of each of the n^rc recomputed micro-batches
  (:func:`recomputed_micro_batches`: m under ``always``, m - 1 under ``except_last``, 0 under ``never``) first runs
  the segment's forward again, so its chunk computes ``delta_k * b_hat * (o_l + o_l + o'_l) / (phi_k f_k)``
  (:func:`pipeline_delay` gives the critical path of the two chunk kinds) and the energy counts
  m chunks + n^rc extra forwards (:func:`compute_energy` twice). ``never`` is eq. (15)-(16) as above.
"""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np


class Schedule(StrEnum):
    """The stage orders a cluster's pipeline may run (``pipeline.schedule``): GPipe (all m forwards, then all m
    backwards) or 1F1B (stage k: min(S - k - 1, m) warm-up forwards, then one forward / one backward)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


def held_micro_batches(schedule: str, m: int, S: int, k: int) -> int:
    """Micro-batches whose activations stage k (0-based, of S) holds at once: m under GPipe (every forward
    ends before the first backward), min(m, S - k) under 1F1B (its warm-up forwards plus the one in flight)."""
    if schedule not in tuple(Schedule):
        raise ValueError(f"schedule {schedule!r} must be one of {', '.join(Schedule)}")
    if not 0 <= k < S:
        raise ValueError(f"stage k={k} must be in 0..S-1 with S={S}")
    return int(m) if schedule == Schedule.GPIPE else min(int(m), S - k)


def held_samples(schedule: str, b: int, m: int, S: int, k: int) -> int:
    """Samples whose activations stage k holds at once (C7's activation term): the whole batch b under GPipe;
    under 1F1B min(b, b_hat * min(m, S - k)) with b_hat = ceil(b / m) (eq. 5), the largest micro-batches."""
    if schedule == Schedule.GPIPE:
        return int(b)
    return min(int(b), micro_batch_size(b, m) * held_micro_batches(schedule, m, S, k))


class Checkpoint(StrEnum):
    """``pipeline.checkpoint``: GPipe's re-materialization (torchgpipe's ``checkpoint`` option). ``never``: a stage
    keeps every held micro-batch's activations for its backward; ``always``: it keeps only each micro-batch's segment
    input z^s and recomputes the segment's forward in that micro-batch's backward (about one extra forward per
    micro-batch); ``except_last``: as ``always`` but the last micro-batch (i = m - 1) keeps its activations, since
    under GPipe its backward comes right after its forward and a recompute would save nothing."""

    NEVER = "never"
    EXCEPT_LAST = "except_last"
    ALWAYS = "always"


def checkpoint_stop(checkpoint: str, m: int) -> int:
    """Micro-batches i < stop are checkpointed (torchgpipe's ``checkpoint_stop``): m under ``always``, m - 1 under
    ``except_last``, 0 under ``never``."""
    stops = {Checkpoint.ALWAYS: int(m), Checkpoint.EXCEPT_LAST: max(0, int(m) - 1), Checkpoint.NEVER: 0}
    if checkpoint not in stops:
        raise ValueError(f"checkpoint {checkpoint!r} must be one of {', '.join(Checkpoint)}")
    return stops[Checkpoint(checkpoint)]


def held_activation_samples(schedule: str, checkpoint: str, b: int, m: int, S: int, k: int) -> tuple[int, int]:
    """(full, inputs): at stage k's memory peak, the samples whose whole segment activations it holds (delta_k
    blocks' saved tensors each) and the samples of which it holds only the segment input z^s (a checkpointed
    micro-batch waiting for its backward). ``never``: (:func:`held_samples`, 0). With checkpointing the peak is in
    a backward: one micro-batch of b_hat = ceil(b / m) recomputed in full, every other held micro-batch as its
    input; under 1F1B with ``except_last`` the last micro-batch's full activations are still held while stage k
    recomputes the earlier ones of its cool-down, so two micro-batches count in full there."""
    held = held_samples(schedule, b, m, S, k)
    stop = checkpoint_stop(checkpoint, m)
    if stop == 0:
        return held, 0
    in_full = 2 if (checkpoint == Checkpoint.EXCEPT_LAST and schedule == Schedule.ONE_F_ONE_B) else 1
    full = min(held, micro_batch_size(b, m) * min(in_full, held_micro_batches(schedule, m, S, k)))
    return full, held - full


def micro_batch_size(b: int, m: int) -> int:
    """b_hat = ceil(b / m) (eq. 5): the largest micro-batch torch.tensor_split makes."""
    return int(math.ceil(b / m))


def chunk_compute_delay(delta, b_hat, flops_per_sample_block, flops_per_second):
    """delta_k * b_hat * (o_l + o'_l) / (phi_k f_k): compute time of one micro-batch on device k (s). A recomputed
    micro-batch (``pipeline.checkpoint``) computes delta_k * b_hat * (o_l + o_l + o'_l) / (phi_k f_k): pass
    o_l + o_l + o'_l, or add this function at o_l (its recompute) to the chunk."""
    return np.asarray(delta, dtype=float) * b_hat * flops_per_sample_block / np.asarray(flops_per_second, dtype=float)


def recomputed_micro_batches(checkpoint: str, m):
    """n^rc: the micro-batches whose backward recomputes their segment's forward (:func:`checkpoint_stop`'s count,
    for one m or an array of them): m under ``always``, max(m - 1, 0) under ``except_last``, 0 under ``never``."""
    checkpoint_stop(checkpoint, 1)  # the name is one of Checkpoint's
    m_arr = np.asarray(m)
    if checkpoint == Checkpoint.ALWAYS:
        return m_arr
    return np.maximum(m_arr - 1, 0) if checkpoint == Checkpoint.EXCEPT_LAST else np.zeros_like(m_arr)


def pipeline_delay(stage_chunk_s, S: int, m: int, recomputed_chunk_s=None, recomputed: int = 0) -> float:
    """(S + m - 1) * max_k chunk_k (eq. 15): GPipe fill, steady state and drain over S stages.

    With re-materialization, ``recomputed`` = n^rc micro-batches (i < n^rc, :func:`recomputed_micro_batches`)
    whose chunks are ``recomputed_chunk_s`` (chunk_k plus the recompute delta_k b_hat o_l / (phi_k f_k)) and
    C = max_k chunk_k, C^rc = max_k chunk^rc_k:
    ``(m - n^rc) C + (S + n^rc - 1) C^rc`` (n^rc >= 1). GPipe runs the backwards in descending i, so the m - n^rc
    micro-batches kept in full come first and the recomputed ones after; a critical path over the clocks visits
    S + m - 1 (micro-batch, stage) cells, every micro-batch at least once, so the longest one takes each
    kept micro-batch once and spends its other S + n^rc - 1 cells on recomputed ones. ``always`` (n^rc = m):
    (S + m - 1) C^rc; ``except_last`` (n^rc = m - 1): C + (S + m - 2) C^rc. With equal stages this is the exact
    critical path of the GPipe order (``pipeline/schedule.py``); under 1F1B (the kept micro-batch's backward
    last) it is an upper bound."""
    chunks = np.asarray(stage_chunk_s, dtype=float)
    if chunks.size == 0:
        return 0.0
    n = int(recomputed)
    if recomputed_chunk_s is None or n <= 0:
        return float((S + m - 1) * chunks.max())
    slow = float(np.max(recomputed_chunk_s))
    if n >= m:
        return float((S + m - 1) * slow)
    return float((m - n) * chunks.max() + (S + n - 1) * slow)


def compute_energy(kappa, delta, b_hat, flops_per_sample_block, flops_per_cycle, f_hz, m: float | np.ndarray):
    """m * kappa * (delta b_hat (o_l + o'_l) / phi_k) * f_k^2: dynamic CPU energy of eq. (16) (J). The recompute of
    re-materialization is this at o_l (``flops_per_sample_block``) and n^rc (``m``): n^rc extra forwards of
    delta b_hat o_l / phi_k cycles, so E_k's compute is kappa (m (o_l + o'_l) + n^rc o_l) delta b_hat f_k^2 / phi_k."""
    cycles = np.asarray(delta, dtype=float) * b_hat * flops_per_sample_block / np.asarray(flops_per_cycle, dtype=float)
    return m * kappa * cycles * np.asarray(f_hz, dtype=float) ** 2


def round_delay(pipeline_s, uplink_s) -> float:
    """tau(t) = max_n (tau_n^pipe + tau_n^Up) over the clusters that take part (eq. 26)."""
    total = np.asarray(pipeline_s, dtype=float) + np.asarray(uplink_s, dtype=float)
    return float(total.max()) if total.size else 0.0
