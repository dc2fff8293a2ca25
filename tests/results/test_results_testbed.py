"""results/testbed_delay.py: the measured round delay, the modelled-vs-measured errors and the value of measuring,
computed by hand on synthetic run folders (no training)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.results_scripts import modelled_section

SCRIPT = ROOT / "results" / "testbed_delay.py"


@pytest.fixture(scope="module")
def testbed():
    spec = importlib.util.spec_from_file_location("testbed_delay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _client(train: float, upload: float, wait: float, fwd: float, bwd: float, head: float) -> dict:
    return {
        "seconds-train": train,
        "seconds-upload": upload,
        "seconds-uplink-wait": wait,
        "seconds-step-forward": fwd,
        "seconds-step-backward": bwd,
        "seconds-step-update": 0.1,
        "seconds-step-embed": 0.05,
        "seconds-step-head": head,
    }


def _cluster(pipe: float, up: float, ovh: float) -> dict:
    return {"pipeline_s": pipe, "uplink_s": up, "overhead_s": ovh, "delay_s": pipe + up}


def _write_run(folder: Path, rounds: list[tuple[float, float, dict, dict]]) -> None:
    """rounds: (train loss, modelled round delay, {n: modelled cluster}, {n: client metrics})."""
    folder.mkdir(parents=True)
    lines = [json.dumps({"round": 0, "elapsed_s": 1.0})]
    for t, (loss, delay, modelled, clients) in enumerate(rounds, start=1):
        clusters = [modelled.get(n, {"delay_s": 0.0}) for n in range(2)]  # a cluster not selected: delay 0
        lines.append(
            json.dumps(
                {
                    "round": t,
                    "train_loss": loss,
                    "modelled": modelled_section(delay, clusters),
                    "clients": {str(n): c for n, c in clients.items()},
                }
            )
        )
    (folder / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text("{}")


def test_cluster_rows_and_round_series_by_hand(testbed, tmp_path):
    run = tmp_path / "methods" / "s0" / "dssra"
    _write_run(
        run,
        [
            (5.0, 9.0, {0: _cluster(2.0, 1.0, 0.0), 1: _cluster(3.0, 1.0, 0.0)},
             {0: _client(4.0, 1.0, 0.5, 1.5, 1.0, 2.0), 1: _client(5.0, 2.0, 0.5, 1.0, 1.0, 1.0)}),
            (4.0, 3.0, {0: _cluster(1.0, 2.0, 0.5)}, {0: _client(3.0, 1.5, 0.25, 1.0, 0.8, 1.0)}),
        ],
    )  # fmt: skip
    rows = testbed.cluster_rows(run)
    assert len(rows) == 3
    first = rows[0]
    # forward + backward + update - embed; uplink wait + upload; head - wait + embed; train + upload
    assert first["measured_pipeline_s"] == pytest.approx(1.5 + 1.0 + 0.1 - 0.05)
    assert first["measured_uplink_s"] == pytest.approx(0.5 + 1.0)
    assert first["measured_overhead_s"] == pytest.approx(2.0 - 0.5 + 0.05)
    assert first["measured_s"] == pytest.approx(5.0)
    measured, modelled, loss = testbed.round_series(run)
    assert measured == [pytest.approx(7.0), pytest.approx(4.5)]  # eq. (26)'s max over the clusters
    assert modelled == [9.0, 3.0] and loss == [5.0, 4.0]
    assert testbed.seconds_to(measured, loss, 4.5) == pytest.approx(11.5)
    assert math.isnan(testbed.seconds_to(measured, loss, 3.0))


def test_report_figures_by_hand(testbed, tmp_path):
    def one(name, secs, modelled, loss):
        clients = {0: _client(secs - 1.0, 1.0, 0.0, secs / 2, secs / 2 - 1.05, 0.0)}
        rounds = [(lo, modelled, {0: _cluster(secs - 1.0, 1.0, 0.0)}, clients) for lo in loss]
        _write_run(tmp_path / name, rounds)

    one("methods/s0/dssra", 4.0, 4.0, [5.0, 4.0, 3.0])
    one("methods/s0/uniform", 8.0, 6.0, [5.0, 4.5, 3.5])
    one("value/s0/slow0_config", 10.0, 5.0, [5.0, 4.0])
    one("value/s0/slow0_measured", 5.0, 5.0, [5.0, 4.0])
    summary = testbed.report(tmp_path, tmp_path / "out", target=3.5)
    fig = summary["figures"]
    # rounds after the first: DSSRA 4 s, uniform 8 s a round -> (8 - 4) / 8; modelled (6 - 4) / 6
    assert fig["measured_round_margin_vs_uniform"] == pytest.approx(0.5)
    assert fig["modelled_round_margin_vs_uniform"] == pytest.approx(1 / 3)
    assert fig["measured_profile_speedup_mean"] == pytest.approx(2.0)
    # every modelled value equals its measured one here: eq. (26) = pipeline + uplink = secs
    assert fig["eq26_median_rel_error"] == pytest.approx(0.0)
    target = {r["run"]: r for r in summary["methods"]}["dssra"]
    assert target["target_loss"] == 3.5 and target["measured_s_to_target"] == pytest.approx(12.0)
    assert (tmp_path / "out" / "summary.md").read_text().count("| dssra |") == 1
    # the target is the caller's, never the runs' worst final loss: at 3.0 only DSSRA reaches it (12 s), and
    # without one nothing is timed
    late = {r["run"]: r for r in testbed.report(tmp_path, tmp_path / "out3", target=3.0)["methods"]}
    assert late["dssra"]["measured_s_to_target"] == pytest.approx(12.0)
    assert math.isnan(late["uniform"]["measured_s_to_target"])
    unset = testbed.report(tmp_path, tmp_path / "out_unset")
    assert all(math.isnan(r["measured_s_to_target"]) for r in unset["methods"])
    assert "no target set" in (tmp_path / "out_unset" / "summary.md").read_text()
