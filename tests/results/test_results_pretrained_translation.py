"""results/pretrained_translation/README.md is what results/pretrained_translation.py makes of the kept records; the
central runs see as many training examples as a federated run; the report's one verdict rule by hand."""

from __future__ import annotations

import gzip
import json

from tests.paths import ROOT
from tests.results_scripts import load

OUT = ROOT / "results" / "pretrained_translation"


def _module():
    return load("pretrained_translation")


def test_the_committed_readme_is_regenerated_from_the_kept_records():
    committed = (OUT / "README.md").read_text(encoding="utf-8")
    assert _module().report() == committed, "results/pretrained_translation/README.md differs: run its --report"


def test_central_runs_see_the_federated_runs_examples():
    """The federated records' CU num-examples summed over the rounds, against each central record's steps x b."""
    for path in sorted(OUT.glob("federated_s*.rounds.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            rounds = [json.loads(line) for line in f if line.strip()]
        seen = sum(c["num-examples"] for r in rounds for c in (r.get("clients") or {}).values())
        assert seen == _module().CENTRAL_STEPS * 16, path.name
    for path in sorted(OUT.glob("central_s*.json")):
        record = json.loads(path.read_text())
        assert record["steps"] * record["task"]["batch_size"] == record["examples"] == _module().CENTRAL_STEPS * 16


def test_the_verdict_rule_by_hand():
    verdict = _module()._verdict
    assert verdict([2.0, 2.2, 1.8], [1.0], "x") == "beats x"  # gain 1.0 > sd 0.2
    assert verdict([1.3, 1.5, 1.1], [1.2, 1.3], "x") == "no clear gain"  # gain 0.05 < sd 0.2
    assert verdict([2.0], [1.0], "x").startswith("no verdict")
