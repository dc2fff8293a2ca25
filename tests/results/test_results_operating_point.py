"""results/operating_point/table.md is what results/operating_point.py makes of the kept records, and its counts
follow the records by hand."""

from __future__ import annotations

from tests.paths import ROOT
from tests.results_scripts import load


def _module():
    return load("operating_point")


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


def test_the_drift_row_reads_the_largest_peak_of_each_five_rounds(tmp_path):
    """A made-up record of 12 rounds whose largest device peak is 100 + 10 t MiB in round t (t = 1..12): the first
    five rounds peak at 150, the middle five (rounds 5..9) at 190, the last five at 220; the error median by hand."""
    import gzip
    import json

    op = _module()
    rounds = [{"round": 0}]
    for t in range(1, 13):
        peaks = [(100 + 10 * t) * 2**20, 50 * 2**20]
        clusters = {"0": {"measured_bytes": peaks, "modelled_bytes": [1.0, 1.0]}}
        rounds.append({"round": t, "memory": {"clusters": clusters, "relative_error_median": t / 100}})
    name = "long_translation_q2"
    with gzip.open(tmp_path / f"{name}.rounds.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rounds))
    assert op.drift_rows(tmp_path) == [f"| {name} | 12 | 150 | 190 | 220 | 6.5% |"]
