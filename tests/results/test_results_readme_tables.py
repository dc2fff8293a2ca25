"""results/README.md's marked tables are what results/readme_tables.py makes of the kept records, and a row follows
its CSV by hand."""

from __future__ import annotations

import csv
import statistics

import pytest

from tests.paths import ROOT
from tests.results_scripts import load

RESULTS = ROOT / "results"


def _module():
    return load("readme_tables")


def test_every_marked_table_of_the_readme_is_regenerated_from_the_kept_records():
    tables = _module()
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    for name in tables.TABLES:
        assert f"<!-- table:{name} -->" in readme, f"results/README.md has no block {name}"
    assert tables.render(readme) == readme, "results/README.md differs: run python results/readme_tables.py"


def test_a_margin_row_follows_its_csv_by_hand():
    with (RESULTS / "fig7_8" / "classification" / "methods.csv").open() as f:
        rows = list(csv.DictReader(f))
    ours = {r["seed"]: float(r["compute_s"]) for r in rows if r["method"] == "collapipe"}
    titanic = {r["seed"]: float(r["compute_s"]) for r in rows if r["method"] == "titanic"}
    red = [100 * (1 - ours[s] / titanic[s]) for s in ("0", "1", "2")]
    mean, sd = statistics.mean(red), statistics.stdev(red)
    gap = mean - 18.94
    expected = f"{mean:.2f}% +- {sd:.2f} | " + (
        f"match ({abs(gap):.1f} pp)" if abs(gap) <= 10 else f"miss ({gap:+.0f} pp)"
    )
    row = next(line for line in _module().fig7_8_margins() if "Fig. 8 classification, CollaPipe vs TITANIC" in line)
    assert row.endswith(f"| {expected} |")


def test_the_verdict_rule_and_a_block_without_its_end_or_maker():
    tables = _module()
    assert tables.verdict(12.0, 15.09) == "match (3.1 pp)"
    assert tables.verdict(-1.0, 15.09) == "miss (sign)"
    assert tables.verdict(40.0, 15.09) == "miss (+25 pp)"
    with pytest.raises(ValueError, match="has no <!-- /table:fig7_8_compute -->"):
        tables.render("x\n<!-- table:fig7_8_compute -->\nold\n")
    with pytest.raises(ValueError, match="'nothing' that results/readme_tables.py does not make"):
        tables.render("<!-- table:nothing -->\n<!-- /table:nothing -->\n")


def test_a_block_inside_a_list_item_keeps_its_indent():
    tables = _module()
    out = tables.render("- item:\n\n  <!-- table:fig4_grid -->\n  old\n  <!-- /table:fig4_grid -->\n")
    body = out.split("<!-- table:fig4_grid -->\n", 1)[1].split("  <!-- /table:fig4_grid -->", 1)[0]
    assert body.splitlines() == ["  " + line for line in tables.fig4_grid()]


def test_no_table_of_the_readme_lies_outside_a_generated_block():
    inside, loose = False, []
    for number, line in enumerate((RESULTS / "README.md").read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("<!-- table:", "<!-- claims table")):
            inside = True
        elif stripped.startswith(("<!-- /table:", "<!-- end of the claims")):
            inside = False
        elif stripped.startswith("|") and not inside:
            loose.append(number)
    assert not loose, f"results/README.md lines {loose} hold a table typed by hand: generate it"


def test_the_trained_job_times_follow_the_summaries_by_hand():
    import json

    seconds = [
        json.loads(path.read_text())["wall_s"]
        for path in (RESULTS / "trained" / "jobs" / "translation" / "methods").glob("seed*/*/summary.json")
    ]
    assert len(seconds) == 15
    row = next(line for line in _module().trained_jobs() if line.startswith("| translation:"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].split(" / ")[0] == "15"
    assert cells[2].split(" / ")[0] == f"{sum(seconds) / 3600:.2f}"
    assert cells[3].split(" / ")[0] == f"{min(seconds):,.0f}-{max(seconds):,.0f}"


def test_the_learning_claims_carry_every_margin_row_of_the_generated_files():
    learning = (RESULTS / "trained" / "learning.md").read_text(encoding="utf-8")
    margins = [line for line in learning.splitlines() if line.startswith(("| Fig. 6", "| Figs. 6"))]
    claims = _module().trained_claims()
    assert len(claims) == 2 + len(margins) + 6  # header, rule, Fig. 6 rows, three grid rows per grid task
    vanilla = next(line for line in margins if "+19.5%" in line and "| vanilla_fl |" in line)
    gap = vanilla.split("|")[4].strip()
    assert any("CollaPipe minus VanillaFL" in line and f"| {gap} |" in line for line in claims)
