"""The tables of results/README.md that come from kept records, generated into their marked blocks.

``python results/readme_tables.py`` rewrites every block of ``results/README.md`` that lies between a line
``<!-- table:NAME -->`` and a line ``<!-- /table:NAME -->`` with what :data:`TABLES` [NAME] makes of the kept
records; ``tests/results/test_results_readme_tables.py`` fails when a committed block differs. The prose around a
block is written by hand and cites it. (The claims table has its own block and script, ``results/claims.py``; the
testbed campaign's tables are files of their own, ``results/testbed_paper_tables.py``.)

The trained-budget campaign (``results/trained/runs.csv``, ``trained/grid.md`` and the central references in
``results/trained/jobs/``, all from the records ``results/trained_learning.py`` keeps -- measured): the final
validation metric per method, mean +- sd over seeds 0, 1, 2, over the central recipe's; Figs. 9-10's (S, m) grid;
the paper's learning claims at a glance (the rows of ``trained/learning.md``'s and ``trained/grid.md``'s claims
tables, which that script writes from the records); each part's job count and wall time (the records' own seconds).

Fig. 11 (``results/fig11/policies.csv``, modelled): DSSRA's reduction of the cumulative delay against each
scheduling baseline, the same rule (a miss further than ``MATCH_PP`` with an sd above it also gives the sd).

Fig. 5, Fig. 11's uplink share and bandwidth sensitivity and the Lyapunov settings come from the ``name: value``
files their scripts keep (``fig5/figures.txt``, ``fig11/uplink_share.txt``, ``lyapunov/<setting>/figures.txt``) or
the table its script keeps (``fig11/bandwidth/table.md``, ``fig7_8/device_spread_<task>_paper_size/table.md``;
Table III's memory from ``fig7_8/<folder>/table.md``).

Figs. 7-8 (``results/fig7_8/<folder>/methods.csv``: the planner over the system model, 50 rounds, seeds 0, 1, 2 --
modelled): CollaPipe's reduction against a baseline is ``100 (1 - ours / theirs)`` per seed, mean +- sd over the
seeds (as ``results/fig7_8_methods.py`` computes it). A margin *matches* the paper's when it has the paper's sign
and lies within ``MATCH_PP`` percentage points of it, else it is a *miss* (by sign, or by its distance).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent
if str(RESULTS) not in sys.path:  # the sections and reportlib beside it, when loaded by path
    sys.path.insert(0, str(RESULTS))

from readme_sections.fig7_8 import (  # noqa: E402
    fig7_8_compute,
    fig7_8_device_spread,
    fig7_8_margins,
    fig7_8_round_delay,
    table3_memory,
)
from readme_sections.optimizer import (  # noqa: E402
    fig4_grid,
    fig5_clusters,
    fig11_bandwidth,
    fig11_policies,
    fig11_uplink_share,
    lyapunov_table,
)
from readme_sections.trained import trained_claims, trained_final, trained_grid, trained_jobs  # noqa: E402
from readme_sections.verdict import verdict  # noqa: E402, F401  (the rule, read by tests/results/test_results_readme_tables.py)

README = RESULTS / "README.md"


TABLES: dict[str, Callable[[], list[str]]] = {
    "fig7_8_device_spread": fig7_8_device_spread,
    "table3_memory": table3_memory,
    "trained_grid_translation": lambda: trained_grid("translation"),
    "trained_grid_ner": lambda: trained_grid("ner"),
    "fig11_bandwidth": fig11_bandwidth,
    "fig5_clusters": fig5_clusters,
    "lyapunov": lyapunov_table,
    "fig11_uplink_share": fig11_uplink_share,
    "fig4_grid": fig4_grid,
    "fig11_policies": fig11_policies,
    "trained_translation": lambda: trained_final("translation"),
    "trained_classification": lambda: trained_final("classification"),
    "trained_ner": lambda: trained_final("ner"),
    "trained_claims": trained_claims,
    "trained_jobs": trained_jobs,
    "fig7_8_margins": fig7_8_margins,
    "fig7_8_compute": fig7_8_compute,
    "fig7_8_round_delay": fig7_8_round_delay,
}


def render(readme: str) -> str:
    """``readme`` with every marked block regenerated (indented as its markers are, e.g. inside a list item); a
    block without its end marker, or a name not in TABLES, is a ValueError naming it."""
    for indent, name in re.findall(r"^( *)<!-- table:(\S+) -->$", readme, flags=re.M):
        if name not in TABLES:
            raise ValueError(f"results/README.md marks a table {name!r} that results/readme_tables.py does not make")
        begin, end = f"{indent}<!-- table:{name} -->\n", f"{indent}<!-- /table:{name} -->"
        head, rest = readme.split(begin, 1)
        if end not in rest:
            raise ValueError(f"results/README.md: the block {name!r} has no {end.strip()} line")
        tail = rest.split(end, 1)[1]
        body = "".join(f"{indent}{line}\n" for line in TABLES[name]())
        readme = head + begin + body + end + tail
    return readme


def main() -> int:
    text = README.read_text(encoding="utf-8")
    new = render(text)
    README.write_text(new, encoding="utf-8")
    print(f"{README}: {'unchanged' if new == text else 'tables regenerated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
