"""What a person watching a run reads: why a CU sits out, steps per CU during a round, the end summary."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from collapipe_flwr.dssra.selectors import ChannelProblem, sit_out_reason
from collapipe_flwr.fl.records.progress import RoundProgress
from collapipe_flwr.fl.server.server_main import summary_lines


def _problem(cost, virtual, feasible=None) -> ChannelProblem:
    cost = np.asarray(cost, dtype=float)
    feasible = np.isfinite(cost) if feasible is None else np.asarray(feasible, dtype=bool)
    n, j = cost.shape
    return ChannelProblem(cost, np.asarray(virtual, float), np.zeros(n), np.ones((n, j)), feasible, {})


def test_sit_out_reasons_name_the_cause():
    inf = np.inf
    # CU 1 has no feasible channel at all (C8)
    p = _problem([[1.0, 2.0], [inf, inf]], [5.0, 5.0])
    assert "E_n^max" in sit_out_reason(p, [0, None], 1, uses_queues=True)
    # one channel, two CUs: CU 1 lost it to CU 0
    p = _problem([[1.0], [2.0]], [5.0, 5.0])
    assert sit_out_reason(p, [0, None], 1, uses_queues=True) == "all 1 usable channels went to other CUs"
    # a free channel exists but the sit-out (virtual channel) cost 0.5 beats its cost 3.0
    p = _problem([[1.0, 2.0], [4.0, 3.0]], [5.0, 0.5])
    reason = sit_out_reason(p, [0, None], 1, uses_queues=True)
    assert "sitting out costs less" in reason and "0.5 < 3" in reason
    # a baseline without queues that left a free channel unused: its ranking decided
    assert "ranked below" in sit_out_reason(p, [0, None], 1, uses_queues=False)
    assert sit_out_reason(p, [0, 1], 1, uses_queues=True) == ""


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=60, soft_wrap=True, highlight=False, color_system=None), out


def test_round_start_says_who_sits_out_and_why_on_one_line():
    console, out = _console()
    progress = RoundProgress(3, "bleu", console=console, interval_s=0)
    progress.round_started(2, [1], {0: "all 1 usable channels went to other CUs [sic]"})
    lines = out.getvalue().splitlines()
    assert lines == ["round 2/3 training CUs [1]; CU 0 sits out: all 1 usable channels went to other CUs [sic]"]


def test_round_start_prints_each_selected_cus_segments():
    console, out = _console()
    progress = RoundProgress(3, "bleu", console=console, interval_s=0)
    segments = {1: (2, 8, (2, 1, 0, 0)), 2: (3, 4, [0, 1, 1, 1])}
    progress.round_started(1, [1, 2], {0: "all 2 usable channels went to other CUs"}, None, segments)
    assert out.getvalue().splitlines() == [
        "round 1/3 training CUs [1, 2]: CU 1 S=2 m=8 [2,1,0,0], CU 2 S=3 m=4 [0,1,1,1]; "
        "CU 0 sits out: all 2 usable channels went to other CUs"
    ]


def test_a_thousand_cus_give_a_console_line_of_bounded_length():
    """N = 1000 printed one 58 KB line per round (issue 45): the first 8 CUs are named, the rest counted."""
    console, out = _console()
    progress = RoundProgress(3, "bleu", console=console, interval_s=0)
    selected = list(range(0, 1000, 2))
    segments = {n: (2, 4, (1, 2, 0, 0)) for n in selected}
    left_out = {n: "all 500 usable channels went to other CUs" for n in range(1, 1000, 2)}
    progress.round_started(1, selected, left_out, None, segments)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("round 1/3 training CUs 500 CUs: CU 0 S=2 m=4 [1,2,0,0], CU 2 S=2 m=4")
    assert ", ... and 492 more plans (in rounds.jsonl); CU 1 sits out: all 500" in line
    assert line.endswith("; ... and 492 more CUs sit out (in rounds.jsonl)") and len(line) < 1000
    busy = progress.progress_line(1, selected, {n: n % 7 for n in selected}, 12.0)
    # by hand: n = 0, 2, .., 998 gives residues 0,2,4,6,1,3,5 (21) 71 times, then 0+2+4: 1497
    assert busy == "round 1/3: 500 CUs 0-6 steps, 1497 in all (12 s)"
    console, out = _console()
    record = {"failures": [{"cluster": n, "error": "no reply"} for n in range(20)]}
    RoundProgress(3, "bleu", console=console, interval_s=0).round_finished(1, record)
    assert out.getvalue().strip().endswith("CU 7: no reply; ... and 12 more failures (in rounds.jsonl)")


def test_progress_lines_count_the_steps_of_this_round_per_cu():
    console, out = _console()
    served = {0: 40, 1: 40}  # steps served in earlier rounds: not this round's progress
    lock = threading.Lock()

    def steps_of():
        with lock:
            return dict(served)

    progress = RoundProgress(5, "bleu", console=console, interval_s=0.05, steps_per_round=40)
    progress.round_started(2, [0, 1], None, steps_of)
    with lock:
        served.update({0: 52, 1: 47})
    deadline = time.time() + 5
    while "CU 0 12/40 steps, CU 1 7/40 steps" not in out.getvalue() and time.time() < deadline:
        time.sleep(0.02)
    progress.round_finished(2, {"train_loss": 1.5, "failures": [{"cluster": 1, "error": "no reply"}]})
    text = out.getvalue()
    assert "round 2/5: CU 0 12/40 steps, CU 1 7/40 steps" in text
    assert text.splitlines()[-1] == "round 2/5 done | train loss 1.5000 | failed: CU 1: no reply"
    n_lines = len(text.splitlines())
    time.sleep(0.2)  # the ticker stopped with the round
    assert len(out.getvalue().splitlines()) == n_lines


def test_summary_lines_say_metric_times_folder_and_plots(tmp_path: Path):
    summary = {
        "final_val": {"bleu": 13.174, "loss": 3.2, "examples": 1014.0},
        "num_rounds": 5,
        "wall_s": 276.4,
        "measured_round_s": 250.2,
        "modelled_delay_s": 540.25,
        "plots": [str(tmp_path / "plots" / "loss.png"), str(tmp_path / "plots" / "metric.png")],
    }
    lines = summary_lines(summary, tmp_path, "bleu")
    assert lines[0] == "done: validation bleu 13.17 (loss 3.2) after 5 rounds"
    assert lines[1].startswith("time: 276 s wall, 250 s in rounds; modelled delay of the plans 540.2 s")
    assert lines[2].startswith(f"run folder: {tmp_path} ")
    assert lines[3] == f"plots: {tmp_path / 'plots'}/ (loss.png, metric.png)"
    assert lines[-1] == f"evaluate again: python -m collapipe_flwr.apps.evaluate {tmp_path}"
    virtual = summary_lines({**summary, "clock": "virtual", "virtual_round_s": 81.25}, tmp_path, "bleu")
    assert virtual[1].startswith("time: 81.2 s on the virtual clock (measured compute at the devices' speeds); 276 s")
    assert lines[1].endswith("; 0.0 s on the virtual clock (measured compute at the devices' speeds)")
