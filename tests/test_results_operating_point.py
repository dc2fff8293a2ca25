"""results/operating_point/table.md is what results/operating_point.py makes of the kept records, and its counts
follow the records by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("operating_point", ROOT / "results" / "operating_point.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_regenerated_from_the_kept_records():
    op = _module()
    committed = (ROOT / "results" / "operating_point" / "table.md").read_text(encoding="utf-8")
    assert op.table() == committed, "results/operating_point/table.md differs: run python results/operating_point.py"


def test_the_split_count_follows_the_records():
    op = _module()
    rounds, _, _ = op.load("default_q1")
    plans = [c for r in rounds if r.get("plan") for c in r["plan"]["clusters"] if c["selected"]]
    split = sum(1 for c in plans if len([d for d in c["delta"] if d]) >= 2)  # S counted from delta, not the S field
    assert f"| {split} ({100 * split / len(plans):.0f}%) |" in op.plan_row("default_q1", *op.load("default_q1"))
