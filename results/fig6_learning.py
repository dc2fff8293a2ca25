"""Figs. 6, 9 and 10 from training runs: learning per method (three seeds) and over (S, m).

    python results/fig6_learning.py ROOT --out results/training

ROOT is the folder `bash results/training_runs.sh ROOT` filled: ``<task>/methods/seed<s>/`` (the five methods),
``<task>/long/`` (longer runs, reported as ``<task>_long``), ``<task>/grid/`` (a uniform split over S devices
with a fixed m, seed 0), ``<task>/grid_nodropout/`` (the same with dropout 0, reported as
``<task>_no_dropout``), ``<task>/grid_joint/`` (dropout 0 and ``decoder_update: joint``, reported as
``<task>_no_dropout_joint``) and ``<task>/repeat/`` (CollaPipe again with a methods run's config and seed: the
noise floor of the same seed). Every run is read with the report's own reader
(``collapipe_flwr.experiments.runs``) and per-round series (``aggregate.series``). Writes
``OUT/learning.md`` (per task: final metric and training loss, mean +- sd over seeds, the paper's comparisons as
paired per-seed gaps, and how far the learning of the gradient-exact methods differs), ``OUT/grid.md``
(Figs. 9-10), ``OUT/runs.csv`` and PNGs, and prints ``name: value`` lines.

The paper's statements these numbers are set beside (Section VI.C-D):
- Fig. 6d: translation BLEU "improved by 19.5% compared to baselines";
- Fig. 6c: classification accuracy "outperforms the PipeLine and TITANIC mechanisms by about 1.82% and 0.15%";
- Figs. 6b/6e: NER "a faster reduction in training loss during the early stages of training";
- Fig. 9: translation "the optimal configuration ... S = 2 and m = 2, under which the best learning performance
  is achieved"; Fig. 10: NER "reducing the value of m improves convergence performance".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent
for folder in (RESULTS.parent, RESULTS):  # the package, and learning_sections and reportlib beside this script
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from learning_sections.grid import grid_claims_section, grid_section  # noqa: E402
from learning_sections.methods import (  # noqa: E402
    central_section,
    margin_verdict,
    margins_section,
    method_section,
    repeat_section,
)
from learning_sections.plots import plot_grid, plot_methods  # noqa: E402
from learning_sections.runs import (  # noqa: E402
    CSV_KEYS,
    PART_SUFFIX,
    TASKS,
    gather,
    max_loss_difference,
    paired_gaps,
    read_central,
)
from reportlib.stats import mean_sd  # noqa: E402

# read by tests/results/test_results_learning.py through this script
__all__ = ["central_section", "margin_verdict", "margins_section", "repeat_section", "grid_claims_section"]
__all__ += ["max_loss_difference", "paired_gaps", "mean_sd"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="the folder results/training_runs.sh wrote")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--source", default="training runs under ROOT (`bash results/training_runs.sh ROOT`)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, float] = {}
    where = args.source
    learning = [f"# Learning per method (Fig. 6): {where}", ""]
    grid = [f"# Learning over (S, m) (Figs. 9-10): {where}", ""]
    csv = [",".join(("task", "part", *CSV_KEYS))]
    for task in TASKS:
        gathered: dict[str, list[dict]] = {}
        for part, section, plot, out, figure in (
            ("methods", method_section, plot_methods, learning, "fig6"),
            ("long", method_section, plot_methods, learning, "fig6"),
            ("grid", grid_section, plot_grid, grid, "fig9_10"),
            ("grid_nodropout", grid_section, plot_grid, grid, "fig9_10"),
            ("grid_joint", grid_section, plot_grid, grid, "fig9_10"),
        ):
            runs = gathered[part] = gather(args.root, task, part)
            if not runs:
                continue
            label = task + PART_SUFFIX.get(part, "")  # the long runs, the dropout-free grid: own sections and keys
            out += section(label, runs, figures)
            if any(r["ok"] for r in runs):
                plot(label, runs, args.out / f"{figure}_{label}.png")
            for r in runs:
                values = [task, part] + [r[k] for k in CSV_KEYS]
                csv.append(",".join("" if v is None else str(v) for v in values))
        grid += grid_claims_section(task, gathered["grid"], gathered["methods"], figures)
        learning += central_section(task, read_central(args.root, task), gathered["methods"], figures)
        repeats = gather(args.root, task, "repeat")
        learning += repeat_section(task, gathered["methods"], repeats, figures)
        learning += margins_section(task, gathered["methods"], repeats, figures)
    (args.out / "learning.md").write_text("\n".join(learning) + "\n")
    (args.out / "grid.md").write_text("\n".join(grid) + "\n")
    (args.out / "runs.csv").write_text("\n".join(csv) + "\n")
    for name, value in figures.items():
        print(f"{name}: {value:.4g}")


if __name__ == "__main__":
    main()
