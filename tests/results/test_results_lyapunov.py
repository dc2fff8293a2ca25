"""results/lyapunov.py regenerates its kept figures' records under the current configuration (it once failed with
the default network, which gives device memory as shares of the model's until sized)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.results_scripts import load

KEPT = Path(__file__).resolve().parents[2] / "results" / "lyapunov"


@pytest.mark.parametrize(
    ("setting", "overrides"),
    [
        ("default", []),
        ("selection", ["network=selection", "federation.num_clusters=10", "scheduler.convergence.gamma_max=0.95"]),
    ],
)
def test_the_first_rounds_equal_the_kept_records(tmp_path, setting, overrides):
    """The first 12 rounds of each V, driven afresh, are the kept CSV's rows of those rounds, byte for byte (the
    policy only moves forward, so a shorter drive is a prefix of the kept 150-round one)."""
    lyapunov = load("lyapunov")
    lyapunov.main(["--rounds", "12", "--out", str(tmp_path), *overrides])
    header, *rows = (KEPT / setting / "lyapunov.csv").read_text().splitlines()
    kept = [header] + [r for r in rows if int(r.split(",")[0]) < 12]
    assert (tmp_path / "lyapunov.csv").read_text().splitlines() == kept
