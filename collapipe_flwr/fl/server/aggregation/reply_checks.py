"""What the server accepts from a CU's train reply before it touches the global model.

A reply is aggregated only when its parts are exactly the ones the method trains on the CU (a CU may not
send ``head.*`` when the decoder lives on the server), every tensor has the name, shape and dtype of the
global one, every float is finite, ``num-examples`` (the FedAvg weight) is an integer in
1..local_steps * b, and every metric the server reads besides it is a finite number in its range
(``train-loss``, which weights the round's loss and feeds the queues Y_n; ``seconds-train``; the virtual clock's
``virtual-*-s``). Anything else
is refused with a one-line reason and the round aggregates the others.
"""

from __future__ import annotations

import math

import torch

from collapipe_flwr.errors import CollaPipeError

# A training loss above this is a diverged CU, not a loss to average: the tasks' cross-entropies start near
# log(vocabulary) (about 10 for 30k words) and the CRF's per-sentence loss near 100.
MAX_TRAIN_LOSS = 1e4
# {metric the server reads: (lowest, highest, what it is for)}; num-examples is checked apart (an integer).
READ_METRICS = {
    "train-loss": (0.0, MAX_TRAIN_LOSS, "the round's training loss and the queues Y_n (eq. 29)"),
    "seconds-train": (0.0, 1e7, "the round's measured training time"),
    # the cluster's round on the virtual clock by part (fl/server/virtual_round.py; absent without a clock)
    **{
        f"virtual-{part}-s": (0.0, 1e9, "the round on the virtual clock")
        for part in ("compute", "d2d", "cu", "uplink", "setup", "cluster")
    },
}
OPTIONAL_METRICS = frozenset({"seconds-train", *(k for k in READ_METRICS if k.startswith("virtual-"))})


def check_reply(
    parts: dict[str, dict[str, torch.Tensor]],
    metrics: dict,
    expected: dict[str, dict[str, torch.Tensor]],
    max_examples: int,
) -> None:
    """Raise :class:`CollaPipeError` naming the first thing wrong with a CU's reply."""
    if set(parts) != set(expected):
        raise CollaPipeError(f"the reply carries parts {sorted(parts)} but this method expects {sorted(expected)}")
    for part, reference in expected.items():
        got = parts[part]
        missing = sorted(set(reference) - set(got))
        extra = sorted(set(got) - set(reference))
        if missing or extra:
            what = f"lacks {part}.{missing[0]}" if missing else f"has unexpected {part}.{extra[0]}"
            raise CollaPipeError(f"the reply {what}; the CU runs another model config")
        for name, ref in reference.items():
            value = got[name]
            if tuple(value.shape) != tuple(ref.shape) or value.dtype != ref.dtype:
                raise CollaPipeError(
                    f"the reply's {part}.{name} is {value.dtype} {tuple(value.shape)}, expected "
                    f"{ref.dtype} {tuple(ref.shape)}"
                )
            if torch.is_floating_point(value) and not bool(torch.isfinite(value).all()):
                raise CollaPipeError(
                    f"the reply's {part}.{name} holds NaN or infinite values; the CU's training diverged"
                )
    n = metrics.get("num-examples")
    if (
        isinstance(n, bool)
        or not isinstance(n, (int, float))
        or not math.isfinite(float(n))
        or n != int(n)
        or not 1 <= int(n) <= max_examples
    ):
        raise CollaPipeError(
            f"the reply's num-examples={n!r} is not an integer in 1..{max_examples} "
            "(local_steps x batch size); it cannot weight the average"
        )
    for key, (low, high, use) in READ_METRICS.items():
        if key not in metrics:
            if key in OPTIONAL_METRICS:
                continue
            raise CollaPipeError(f"the reply lacks the metric {key} ({use}); the CU runs another version")
        value = metrics[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(float(value))
            or not low <= float(value) <= high
        ):
            raise CollaPipeError(
                f"the reply's {key}={value!r} is not a finite number in {low:g}..{high:g} ({use}); "
                "the CU's training diverged or it runs another version"
            )
    _check_device_seconds(metrics.get("virtual-device-s", []))


def _check_device_seconds(busy) -> None:
    """The devices' busy seconds on the virtual clock: a list of finite seconds >= 0."""
    if not isinstance(busy, list) or not all(_finite_at_least_0(x) for x in busy):
        raise CollaPipeError(
            f"the reply's virtual-device-s={busy!r} is not a list of finite seconds >= 0 (the devices' busy time on "
            "the virtual clock); the CU runs another version"
        )


def _finite_at_least_0(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
