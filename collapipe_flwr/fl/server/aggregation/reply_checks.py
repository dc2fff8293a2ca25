"""What the server accepts from a CU's train reply before it touches the global model.

A reply is aggregated only when its parts are exactly the ones the method trains on the CU (a CU may not
send ``head.*`` when the decoder lives on the server), every tensor has the name, shape and dtype of the
global one, every float is finite, and its report's ``num-examples`` (the FedAvg weight) is in 1..local_steps * b.
The report's own figures (losses, seconds, the virtual clock's parts) were checked when it was read
(``RoundReport.from_record``). Anything else is refused with a one-line reason and the round aggregates the others.
"""

from __future__ import annotations

import torch

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.round_report import RoundReport


def check_reply(
    parts: dict[str, dict[str, torch.Tensor]],
    report: RoundReport,
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
    n = report.steps.examples
    if not 1 <= n <= max_examples:
        raise CollaPipeError(
            f"the reply's num-examples={n!r} is not an integer in 1..{max_examples} "
            "(local_steps x batch size); it cannot weight the average"
        )
