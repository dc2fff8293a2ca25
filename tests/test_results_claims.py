"""results/claims/table.md is what results/claims.py makes of the kept records, and a row follows its record by hand."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from tests.results_scripts import load

ROOT = Path(__file__).resolve().parent.parent
T_975_2DF = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom (tables)


def _module():
    return load("claims")


def test_the_committed_table_is_regenerated_from_the_kept_records():
    committed = (ROOT / "results" / "claims" / "table.md").read_text(encoding="utf-8")
    assert _module().table() == committed, "results/claims/table.md differs: run python results/claims.py"


def test_the_readme_holds_the_same_table_between_its_markers():
    claims = _module()
    readme = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    assert claims.readme_with(claims.table(), readme) == readme, "results/README.md: run python results/claims.py"


def test_a_computation_row_follows_its_csv_by_hand():
    with (ROOT / "results" / "fig7_8" / "translation_paper_size" / "methods.csv").open() as f:
        rows = list(csv.DictReader(f))
    ours = {r["seed"]: float(r["compute_s"]) for r in rows if r["method"] == "collapipe"}
    base = {r["seed"]: float(r["compute_s"]) for r in rows if r["method"] == "vanilla_fl"}
    gains = [100 * (base[s] - ours[s]) / base[s] for s in ("0", "1", "2")]
    mean = sum(gains) / 3
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / 2)
    half = T_975_2DF * sd / math.sqrt(3)
    cell = f"{mean:+.2f}% [{mean - half:+.2f}, {mean + half:+.2f}]"
    verdict = "reproduced" if mean - half > 0 else ("same sign within noise" if mean > 0 else "opposite sign")
    table = _module().table()
    row = next(
        line for line in table.splitlines() if "computation delay below vanilla_fl" in line and "translation" in line
    )
    assert f"| {cell} |" in row and row.endswith(f"| {verdict} |")


def test_the_verdict_rule_reads_the_sign_and_the_interval():
    paired = _module().Paired
    assert paired((5.0, 6.0, 7.0)).verdict() == "reproduced"
    assert paired((-1.0, 2.0, 5.0)).verdict() == "same sign within noise"
    assert paired((1.0, -2.0, -5.0)).verdict() == "opposite sign"
    assert paired((-5.0, -6.0, -7.0)).verdict() == "opposite sign, outside noise"
