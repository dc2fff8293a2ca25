"""Rendering rows as CSV and markdown (pure: rows in, text out)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: '' for None, short floats, yes/no for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}" if abs(value) >= 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def to_csv(rows: Sequence[Mapping], columns: Sequence[str]) -> str:
    """CSV with a header; full precision (repr) for floats so the numbers can be re-used."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return buffer.getvalue()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(
    rows: Sequence[Mapping],
    columns: Sequence[str],
    headers: Mapping[str, str] | None = None,
    formatters: Mapping[str, Any] | None = None,
) -> str:
    """A GitHub markdown table."""
    headers = dict(headers or {})
    formatters = dict(formatters or {})
    head = "| " + " | ".join(_cell(headers.get(c, c)) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(formatters.get(c, fmt)(row.get(c))) for c in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body]) + "\n"
