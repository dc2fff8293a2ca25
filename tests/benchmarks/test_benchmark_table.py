"""benchmarks/run_all.py: figures read from ``name: value`` lines and judged against their targets."""

from __future__ import annotations

import importlib.util
import sys

from tests.paths import ROOT

SPEC = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
assert SPEC is not None and SPEC.loader is not None
run_all = importlib.util.module_from_spec(SPEC)
sys.modules["run_all"] = run_all  # dataclasses look their module up there
SPEC.loader.exec_module(run_all)


def test_figures_are_read_from_name_value_lines():
    text = "cores: 2\nstep_ratio_S2_m4: 1.42\nactivation_shape: 64x32x256 float32 (2.0 MiB)\nnoise line\n"
    assert run_all.parse_figures(text) == {"cores": 2.0, "step_ratio_S2_m4": 1.42}


def test_rows_say_met_missed_and_not_measured():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra")}
    figures = {"step_ratio_S2_m4": 1.42, "data_plane_inline_default_ms_median": 2.5, "plain_step_s": 0.1}
    figures |= {"overhead_ratio_equal_cores": 1.05, "device_speedup_S2_m4": 0.8}
    pipe = rows["pipeline step, S = 2, m = 4, vs the plain model"].cells(figures)
    assert pipe[1:4] == ["1.42 x", "-", "-"]  # all cores against one per device: context, not a target
    overhead = rows["framework overhead: S = 1, m = 1, one core, vs the plain model on one core"].cells(figures)
    assert overhead[1:4] == ["1.05 x", "-", "-"]  # one run's medians: context (issue 64)
    runs = (
        "framework overhead: S = 1, m = 1, one core, vs the plain model on one core, paired step by step, median of "
        "5 runs"
    )
    assert rows[runs].cells(figures | {"overhead_ratio_equal_cores_paired_median_of_runs": 1.06})[1:4] == [
        "1.06 x",
        "<= 1.05 x",
        "no",
    ]
    speedup = rows["pipeline speed-up: S = 2, m = 4, one core per device, vs S = 1, m = 1 on one core"].cells(figures)
    assert speedup[1:4] == ["0.8 x", "<= 0.68 x", "no"]
    quota_row = "pipeline speed-up: S = 2, m = 4, devices of 0.7 core each (cgroup CPU quota), vs one such device"
    assert rows[quota_row].cells(figures)[1:4] == ["not measured", "<= 0.75 x", "-"]  # no cgroups: no verdict
    assert rows[quota_row].cells(figures | {"device_speedup_S2_m4_quota": 0.7})[1:4] == ["0.7 x", "<= 0.75 x", "yes"]
    default = "default transport (socket)"
    dp = rows[f"data plane fp32 inline, one 64 x 32 x 256 exchange, {default}"].cells(figures)
    assert dp[1:4] == ["2.5 ms", "-", "-"]  # milliseconds are context: the targets are ratios (issue 64)
    paired = rows[f"data plane fp32 inline exchange ({default}) / the same head step in one process, paired"]
    assert paired.cells(figures)[1:4] == ["not measured", "<= 1.5 x", "-"]
    assert paired.cells(figures | {"data_plane_inline_over_in_process": 1.6})[1:4] == ["1.6 x", "<= 1.5 x", "no"]
    shm = rows[
        f"data plane fp32 exchange through shared memory ({default}) / the same head step in one process, paired"
    ]
    assert shm.cells(figures | {"data_plane_shm_over_in_process": 1.1})[1:4] == ["1.1 x", "<= 1.2 x", "yes"]
    figures |= {"data_plane_ms_median": 7.5, "data_plane_socket_ms_median": 2.5}
    grpc = rows["data plane fp32 inline exchange, dataplane.transport=grpc"].cells(figures)
    assert grpc[1:4] == ["7.5 ms", "-", "-"]
    head = rows[f"data plane, the host's head step within the fp32 inline exchange (trivial head, {default})"]
    assert head.cells(figures | {"data_plane_inline_default_head_ms": 0.5})[1:4] == ["0.5 ms", "-", "-"]
    share = rows[f"data plane fp32 inline exchange ({default}) / plain BERT-small step (32 x 64)"].cells(figures)
    assert share[1] == "0.025" and share[3] == "yes"  # 2.5 ms of a 100 ms step
    missing = rows["DSSRA solve, (N, K, J) = (100, 10, 50), one round"].cells(figures)
    assert missing[1:4] == ["not measured", "<= 150 ms", "-"]


def test_pipeline_grid_and_schedule_memory_rows_read_their_figures():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra", "mem")}
    grid = [f for f in rows if f.startswith("pipeline step, ")]
    assert len(grid) == 13  # S = 2, m = 4 (medians), then S = 1, 2, 3 x m = 1, 2, 4, 8
    figures = {"step_ratio_fastest_S3_m8": 0.91, "step_ratio_S3_m8": 5.0, "peak_ratio_1f1b_vs_gpipe_S2_m8": 0.62}
    fastest = rows["pipeline step, S = 3, m = 8, vs the plain model, fastest steps"].cells(figures)
    assert fastest[1:4] == ["0.91 x", "-", "-"]
    assert rows["pipeline step, S = 1, m = 1, vs the plain model, fastest steps"].cells(figures)[1] == "not measured"
    per_mb = rows["1F1B peak memory per stage vs GPipe, S = 2, m = 8, head per micro-batch"].cells(figures)
    assert per_mb[1] == "0.62 x" and per_mb[4] == "`python benchmarks/pipeline_1f1b_memory.py mem`"


def test_pipeline_bound_rows_read_the_critical_path_figures():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra", "mem")}
    figures = {
        "device_speedup_S2_m4_bound": 0.81,
        "fair_S2_m4_over_bound": 1.05,
        "fair_S2_m4_microbatch_inflation": 1.2,
    }
    bound = [f for f in rows if f.startswith("the speed-up S = 2, m = 4's measured calls allow")]
    over = [f for f in rows if f.startswith("S = 2, m = 4: the step over that bound")]
    inflation = [f for f in rows if f.startswith("S = 2, m = 4: the devices' compute over")]
    assert len(bound) == len(over) == len(inflation) == 1
    assert rows[bound[0]].cells(figures)[1:4] == ["0.81 x", "-", "-"]
    assert rows[over[0]].cells(figures)[1] == "1.05 x"
    assert rows[inflation[0]].cells(figures)[1] == "1.2 x"


def test_scaling_rows_judge_growth_in_n_and_server_memory():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra", "mem", "")}
    figures = {
        "round_wall_s_N3": 2.0,
        "round_wall_s_N30": 30.0,  # 15x for 10x the CUs: faster than linear
        "round_wall_growth_per_cu_ratio": 1.5,
        "modelled_delay_s_N3": 8.0,
        "modelled_delay_s_N30": 10.0,
        "round_wall_s_K2": 1.0,
        "round_wall_s_K8": 1.6,
        "server_rss_growth_ratio": 1.02,
    }
    growth = rows["wall-clock per round growth N = 3 -> 30, per CU (1 = linear)"].cells(figures)
    assert growth[1:4] == ["1.5 x", "<= 1 x", "no"]
    modelled = rows["modelled round delay eq. (26), N = 3 -> 30"].cells(figures)
    assert modelled[1] == "1.25 x" and modelled[3] == "-"  # 10 / 8, no target
    k = rows["wall-clock per round, K = 2 -> 8 devices per cluster (N = 3)"].cells(figures)
    assert k[1] == "1.6 x"
    rss = rows["server peak RSS, N = 30 vs N = 3 (fixed model; flat = 1)"].cells(figures)
    assert rss[1:4] == ["1.02 x", "<= 1.1 x", "yes"]
    assert rows["wall-clock per round, N = 30 CUs"].cells(figures)[1] == "30 s"


def test_quick_scaling_rows_name_the_quick_sizes():
    figures = {"round_wall_s_N10": 4.0}
    names = [r.figure for r in run_all.rows("dp", "pipe", "dssra", "mem", "--quick")]
    assert "wall-clock per round, N = 10 CUs" in names
    row = next(r for r in run_all.rows("dp", "pipe", "dssra", "mem", "--quick") if r.figure.endswith("N = 10 CUs"))
    assert row.cells(figures)[1] == "4 s"
    assert "--quick" in row.command


def test_hf_rows_read_the_per_device_memory_and_step_ratios():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra", "mem", "", "--steps 1")}
    hf = [f for f in rows if f.startswith("HF GPT-2 small")]
    assert len(hf) == 8  # S = 1, 2, 4 x (full, LoRA), then S = 1, 2 step ratios
    figures = {"peak_mib_S2_lora": 1234.5, "step_ratio_split_vs_hf_S2_m2": 1.07}
    lora = rows["HF GPT-2 small, per-device peak memory, S = 2, LoRA r = 8"].cells(figures)
    assert lora[1:4] == ["1,234 MiB", "-", "-"]
    assert lora[4] == "`python benchmarks/hf_pipeline_memory.py --steps 1`"
    ratio = rows["HF GPT-2 small, split step S = 2, m = 2 vs the un-split HF model"].cells(figures)
    assert ratio[1:4] == ["1.07 x", "-", "-"]
    assert rows["HF GPT-2 small, per-device peak memory, S = 4, full fine-tuning"].cells(figures)[1] == "not measured"


def test_optimizer_rows_read_each_tasks_fused_speedup():
    rows = {r.figure: r for r in run_all.rows("dp", "pipe", "dssra")}
    names = [f for f in rows if f.startswith("Adam step over the")]
    assert len(names) == 3
    figures = run_all.parse_figures("adam_fused_speedup_ner: 3.17\nadam_fused_speedup_translation: 4.6")
    assert rows["Adam step over the ner model, speed-up of the fused kernel (1 thread)"].cells(figures)[1:4] == [
        "3.17 x",
        "-",
        "-",
    ]
    assert rows["Adam step over the translation model, speed-up of the fused kernel (1 thread)"].cells(figures)[1] == (
        "4.6 x"
    )
    assert (
        rows["Adam step over the classification model, speed-up of the fused kernel (1 thread)"].cells(figures)[1]
        == "not measured"
    )
