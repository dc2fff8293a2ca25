"""Synthetic run records and sweep job folders for the tests of collapipe_flwr.experiments, with totals computed by
hand (HAND)."""

from __future__ import annotations

import json
from pathlib import Path

MIB = 1024 * 1024


def cluster_row(compute, d2d, uplink, device_energy, cu_energy, selected=True):
    pipe = compute + d2d
    return {
        "pipeline_s": pipe,
        "compute_s": compute,
        "d2d_s": d2d,
        "uplink_s": uplink if selected else 0.0,
        "delay_s": pipe + uplink if selected else 0.0,
        "device_energy_j": device_energy,
        "cu_energy_j": cu_energy if selected else 0.0,
        "gamma": 0.0,
        "Y": 0.0,
    }


def plan_row(cluster, selected, S, m, delta):
    return {
        "cluster": cluster,
        "selected": selected,
        "channel": cluster if selected else None,
        "power_w": 0.3,
        "S": S,
        "m": m,
        "delta": delta,
    }


def round_record(t, rows, plans, loss, bleu, peaks, round_s, train_s):
    """One round's record of CollaPipe under DSSRA, as the ServerApp writes it, from its clusters' rows and plans."""
    delays = [r["delay_s"] for r, p in zip(rows, plans) if p["selected"]]
    return {
        "round": t,
        "method": "collapipe",
        "scheduler": "dssra",
        "train_loss": loss,
        "val_bleu": bleu,
        "val_loss": loss,
        "clients": {
            str(p["cluster"]): {
                "num-examples": 10,
                "train-loss": loss,
                "train-losses": [loss],
                "seconds-train": s,
                "device-peak-bytes": pk,
            }
            for p, pk, s in zip([p for p in plans if p["selected"]], peaks, train_s)
        },
        "failures": [],
        "plan": {"round": t, "clusters": plans, "modelled": {}},
        "modelled": {"policy": "dssra", "V": 0.01, "round_delay_s": max(delays), "clusters": rows},
        "measured_s": {"plan_s": 0.01, "round_s": round_s},
    }


def hand_rounds():
    """Two rounds; hand-computed totals in HAND below.

    Round 1: CU0 delay 2+1+1 = 4, CU1 delay 4+1+0.5 = 5.5 (the bottleneck): tau(1) = 5.5 split 4 / 1 / 0.5.
    Round 2: only CU0 trains, delay 1+0.5+0.5 = 2 (CU1's device energy 9 J must be ignored).
    """
    r1 = round_record(
        1,
        [cluster_row(2.0, 1.0, 1.0, [0.5, 0.25], 0.1), cluster_row(4.0, 1.0, 0.5, [1.0], 0.2)],
        [plan_row(0, True, 2, 4, [1, 1, 0]), plan_row(1, True, 1, 2, [2, 0, 0])],
        loss=3.0,
        bleu=1.5,
        peaks=[[100 * MIB, 50 * MIB], [200 * MIB]],
        round_s=10.0,
        train_s=[6.0, 7.0],
    )
    r2 = round_record(
        2,
        [cluster_row(1.0, 0.5, 0.5, [0.5, 0.25], 0.1), cluster_row(3.0, 3.0, 9.0, [9.0], 5.0, selected=False)],
        [plan_row(0, True, 2, 4, [1, 1, 0]), plan_row(1, False, 2, 4, [1, 1, 0])],
        loss=3.5,
        bleu=2.5,
        peaks=[[120 * MIB, 60 * MIB]],
        round_s=12.0,
        train_s=[5.0],
    )
    r0 = {"round": 0, "val_bleu": 0.0, "val_loss": 9.0}
    return [r0, r1, r2]


HAND = {
    "delay_total_s": 7.5,
    "delay_compute_s": 5.0,
    "delay_d2d_s": 1.5,
    "delay_uplink_s": 1.0,
    "energy_device_j": 0.75 + 1.0 + 0.75,
    "energy_cu_j": 0.1 + 0.2 + 0.1,
    "energy_total_j": 2.9,
    "final_metric": 2.5,
    "final_train_loss": 3.5,
    "min_train_loss": 3.0,
    "measured_round_s": 22.0,
    "measured_train_s": 7.0 + 5.0,
    "max_device_mem_mib": 200.0,
    "rounds": 2,
}


def scaled_rounds(factor: float, n_rounds: int = 2, S: int = 2, m: int = 4, uniform_delta=(1, 1, 0)):
    """Rounds whose only CU has delay `factor` (compute factor/2, D2D factor/4, uplink factor/4)."""
    out = [{"round": 0, "val_bleu": 0.0}]
    for t in range(1, n_rounds + 1):
        out.append(
            round_record(
                t,
                [cluster_row(factor / 2, factor / 4, factor / 4, [0.1], 0.01)],
                [plan_row(0, True, S, m, list(uniform_delta))],
                loss=2.0 / t,
                bleu=float(S * 10 + m),
                peaks=[[S * MIB]],
                round_s=1.0,
                train_s=[1.0],
            )
        )
    return out


def write_job(folder: Path, labels: dict, rounds: list | None, ok=True, error="", config=None) -> Path:
    """A sweep job folder as launch writes it: status.json (+ run/ with config.json, rounds.jsonl, summary.json)."""
    folder.mkdir(parents=True)
    run_dir = folder / "run"
    status = {
        "ok": ok,
        "error": error,
        "labels": labels,
        "run_dir": str(run_dir) if rounds is not None else None,
        "wall_s": 30.0,
    }
    (folder / "status.json").write_text(json.dumps(status))
    if rounds is not None:
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps(config or {}))
        (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
        if ok:
            (run_dir / "summary.json").write_text(json.dumps({"final_val": {}}))
    return folder


def labels(method="collapipe", scheduler="dssra", V=0.01, task="translation"):
    return {
        "method": method,
        "scheduler": scheduler,
        "V": V,
        "task": task,
        "model": "transformer_tiny",
        "network": "small",
        "federation": "tiny",
    }
