"""benchmarks/run_all.py: figures read from ``name: value`` lines and judged against their targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "run_all", Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"
)
assert SPEC is not None and SPEC.loader is not None
run_all = importlib.util.module_from_spec(SPEC)
sys.modules["run_all"] = run_all  # dataclasses look their module up there
SPEC.loader.exec_module(run_all)


def test_figures_are_read_from_name_value_lines():
    text = "cores: 2\nstep_ratio_S2_m4: 1.42\nactivation_shape: 64x32x256 float32 (2.0 MiB)\nnoise line\n"
    assert run_all.parse_figures(text) == {"cores": 2.0, "step_ratio_S2_m4": 1.42}


def test_rows_say_met_missed_and_not_measured():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra")}
    figures = {"step_ratio_S2_m4": 1.42, "data_plane_ms_median": 2.5, "plain_step_s": 0.1}
    pipe = rows["pipeline step, S = 2, m = 4, vs the plain model"].cells(figures)
    assert pipe[1:4] == ["1.42 x", "<= 0.75 x", "no"]
    dp = rows["data plane, one 64 x 32 x 256 fp32 exchange"].cells(figures)
    assert dp[1:4] == ["2.5 ms", "<= 3 ms", "yes"]
    share = rows["data plane exchange / plain BERT-small step (32 x 64)"].cells(figures)
    assert share[1] == "0.025" and share[3] == "yes"  # 2.5 ms of a 100 ms step
    missing = rows["DSSRA solve, (N, K, J) = (100, 10, 50), one round"].cells(figures)
    assert missing[1:4] == ["not measured", "<= 200 ms", "-"]


def test_pipeline_grid_and_schedule_memory_rows_read_their_figures():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra", "mem")}
    grid = [f for f in rows if f.startswith("pipeline step, ")]
    assert len(grid) == 13  # S = 2, m = 4 (medians, with its target), then S = 1, 2, 3 x m = 1, 2, 4, 8
    figures = {"step_ratio_fastest_S3_m8": 0.91, "step_ratio_S3_m8": 5.0, "peak_ratio_1f1b_vs_gpipe_S2_m8": 0.62}
    fastest = rows["pipeline step, S = 3, m = 8, vs the plain model, fastest steps"].cells(figures)
    assert fastest[1:4] == ["0.91 x", "-", "-"]
    assert rows["pipeline step, S = 1, m = 1, vs the plain model, fastest steps"].cells(figures)[1] == "not measured"
    per_mb = rows["1F1B peak memory per stage vs GPipe, S = 2, m = 8, head per micro-batch"].cells(figures)
    assert per_mb[1] == "0.62 x" and per_mb[4] == "`python benchmarks/pipeline_1f1b_memory.py mem`"
