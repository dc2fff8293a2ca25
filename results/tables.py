"""Every generated table of results/, rebuilt from the records kept in the repository: one command.

``python results/tables.py`` runs, in order (a later table reads an earlier one's output):

1. ``trained_learning.report``: ``trained/learning.md``, ``grid.md``, ``runs.csv`` and its figures from the
   trained campaign's records (``trained/jobs/``);
2. ``operating_point``: ``operating_point/table.md`` from the default and ``long`` runs' records;
3. ``pretrained_lora.report``: ``pretrained_lora/README.md`` from its records;
4. ``testbed_paper_tables``: ``testbed_paper/table.md`` and ``runs.csv`` from the testbed campaign's records;
   ``virtual_clock_tables``: ``virtual_clock/table.md``, the virtual clock against the testbed;
   ``virtual_paper_tables``: ``virtual_paper/table.md`` and ``runs.csv`` from the virtual-clock campaign's records;
   ``rerun_check``: ``virtual_paper/reruns.md``, kept jobs run again beside their kept records;
5. ``claims``: ``claims/table.md`` and the claims block of ``README.md`` (it reads the runs.csv files above);
6. ``readme_tables``: every other marked table of ``README.md``.

No job is run and nothing is downloaded; each script can still be run alone (its docstring says how). The tests
under ``tests/results/test_results_*.py`` regenerate the same tables and fail when a committed one differs.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling scripts, run as a script or loaded by path

import claims  # noqa: E402
import operating_point  # noqa: E402
import pretrained_lora  # noqa: E402
import readme_tables  # noqa: E402
import rerun_check  # noqa: E402
import testbed_paper_tables  # noqa: E402
import trained_learning  # noqa: E402
import virtual_clock_tables  # noqa: E402
import virtual_paper_tables  # noqa: E402


def _pretrained_lora() -> None:
    (pretrained_lora.OUT / "README.md").write_text(pretrained_lora.report(), encoding="utf-8")


STEPS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("trained/ (learning.md, grid.md, runs.csv, figures)", lambda: trained_learning.report(trained_learning.RECORDS)),
    ("operating_point/table.md", operating_point.main),
    ("pretrained_lora/README.md", _pretrained_lora),
    ("testbed_paper/table.md and runs.csv", testbed_paper_tables.write),
    ("virtual_clock/table.md", virtual_clock_tables.main),
    ("virtual_paper/table.md and runs.csv", virtual_paper_tables.main),
    ("virtual_paper/reruns.md", rerun_check.main),
    ("claims/table.md and the claims block of README.md", claims.main),
    ("README.md's marked tables", readme_tables.main),
)


def main() -> int:
    for name, step in STEPS:
        with contextlib.redirect_stdout(io.StringIO()):  # each script prints its table; one line each here
            step()
        print(f"rebuilt {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
