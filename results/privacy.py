"""The utility cost of differential privacy on the CUs' uploads (privacy.mode, docs/privacy.md).

Every job is the default ``collapipe run`` (translation, transformer_small, N = 2 clusters, 10 rounds of 20
local steps, seed 0) with one privacy setting: none; central DP with clipping only (C = 1, z = 0); central DP
at three noise multipliers z (sigma = z C / 2 on every parameter of each round's aggregate). The metric is BLEU
on the whole Multi30K validation split after the last round. Each job is skipped when its run folder has
``summary.json`` (resumable); ``--report`` only rebuilds the table (``results/privacy/README.md``).

Usage: ``python results/privacy.py ROOT``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "privacy"
CLIP = 1.0
SETTINGS = {
    "none": "privacy=none",
    "clip_only": f"privacy=central privacy.clipping_norm={CLIP} privacy.noise_multiplier=0",
    "z1e-4": f"privacy=central privacy.clipping_norm={CLIP} privacy.noise_multiplier=0.0001",
    "z1e-3": f"privacy=central privacy.clipping_norm={CLIP} privacy.noise_multiplier=0.001",
    "z1e-2": f"privacy=central privacy.clipping_norm={CLIP} privacy.noise_multiplier=0.01",
}


def final(folder: Path) -> tuple[float | None, float | None]:
    """(last validation BLEU, last round's training loss), None where the run has not finished."""
    if not (folder / "summary.json").is_file():
        return None, None
    records = read_jsonl(folder / "rounds.jsonl")
    bleu = [r["val_bleu"] for r in records if "val_bleu" in r]
    loss = [r["train_loss"] for r in records if r.get("train_loss") is not None]
    return (bleu[-1] if bleu else None), (loss[-1] if loss else None)


def report(root: Path) -> str:
    lines = [
        *md.head("| privacy | overrides | sigma per parameter | final val BLEU | vs none | last train loss |"),
    ]
    base, _ = final(root / "s0" / "none")
    for name, overrides in SETTINGS.items():
        bleu, loss = final(root / "s0" / name)
        z = float(overrides.split("noise_multiplier=")[1]) if "noise_multiplier=" in overrides else None
        sigma = f"{z * CLIP / 2:g}" if z is not None else "-"
        if bleu is None:
            lines.append(f"| {name} | `{overrides}` | {sigma} | not run yet | | |")
            continue
        versus = f"{bleu - base:+.2f}" if base is not None and name != "none" else ""
        lines.append(f"| {name} | `{overrides}` | {sigma} | {bleu:.2f} | {versus} | {loss:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--report", action="store_true", help="only rebuild the table from the finished runs")
    args = parser.parse_args(argv)
    names = [f"s0/{name}" for name in SETTINGS]
    done = sum((args.root / name / "summary.json").is_file() for name in names)
    print(f"{done} of {len(names)} jobs done, {len(names) - done} left", flush=True)
    failed = 0
    if not args.report:
        for name, overrides in SETTINGS.items():
            failed += not campaign.run_job(args.root, f"s0/{name}", f"{overrides} seed=0 checkpoint=false")
    table = report(args.root)
    md.write(
        OUT / "README.md",
        "# Differential privacy's cost (results/privacy.py)\n\n`python results/privacy.py ROOT`: the default "
        "translation run (N = 2, 10 rounds of 20 local steps, seed 0), C = 1.\n\n" + table,
    )
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
