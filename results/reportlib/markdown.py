"""What the scripts keep as text: markdown tables written and read back, ``name: value`` files, a generated file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def row(cells: Iterable[object]) -> str:
    """One markdown table row: ``| a | b |`` (each cell as ``str`` gives it)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def head(header: str) -> list[str]:
    """A markdown table's ``header`` row (``| a | b |``; its cells parted by `` | ``) and the rule under it, a
    ``---|`` for each of its columns."""
    return [header, "|" + "---|" * len(header.strip()[2:-2].split(" | "))]


def write(path: Path, text: str) -> None:
    """Write the generated ``text`` to ``path`` (UTF-8), its folder made first when it is not there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def name_values(path: Path) -> dict[str, str]:
    """A script's ``name: value`` lines (``figures.txt``, ``uplink_share.txt``); other lines are skipped."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def table_rows(path: Path) -> list[list[str]]:
    """The cells of every data row of the first table in a kept ``table.md`` (header and rule skipped)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def section_rows(text: str, heading: str, missing_hint: str) -> list[list[str]]:
    """The data rows (cells) of the first table under the markdown heading line ``heading``; a heading that is not
    there is a ValueError naming it, with ``missing_hint`` (how to regenerate the file)."""
    lines = text.splitlines()
    if heading not in lines:
        raise ValueError(f"no heading {heading!r}: {missing_hint}")
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]
