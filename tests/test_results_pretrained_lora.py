"""results/pretrained_lora/README.md is what results/pretrained_lora.py makes of the kept records, and its
headline figures follow the records by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.results_scripts import load

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "pretrained_lora"


def _module():
    return load("pretrained_lora")


def test_the_committed_readme_is_regenerated_from_the_kept_records():
    committed = (OUT / "README.md").read_text(encoding="utf-8")
    assert _module().report() == committed, "results/pretrained_lora/README.md differs: run its --report"


def test_the_headline_follows_the_records():
    with gzip.open(OUT / "federated.rounds.jsonl.gz", "rt", encoding="utf-8") as fh:
        rounds = [json.loads(line) for line in fh if line.strip()]
    base = rounds[0]["val_perplexity"]
    federated = rounds[-1]["val_perplexity"]
    central = json.loads((OUT / "central.json").read_text())["val"]["perplexity"]
    readme = (OUT / "README.md").read_text(encoding="utf-8")
    assert f"{(1 - federated / base):.1%} below the base" in readme
    assert f"federated {federated / central - 1:+.1%} against central" in readme
    # every training CU uploaded the same adapter bytes: the LoRA tensors only, far below the 135M-parameter base
    uploads = {c["upload-bytes"] for r in rounds[1:] for c in r["clients"].values()}
    assert len(uploads) == 1 and uploads.pop() < 135e6 * 4 / 50
