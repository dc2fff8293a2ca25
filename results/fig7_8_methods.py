"""Figs. 7-8 in the model: on-device accumulated computation time of each training method, per task.

    python results/fig7_8_methods.py --task translation --out results/fig7_8/translation [--rounds 50]
        [--seeds 0 1 2] [hydra overrides]

The paper's Figs. 7-8 compare **on-device accumulated computation time** (Transformer on machine translation,
BERT on sentence classification) and state CollaPipe's margins: 15.09% vs VanillaFL, 18.94% vs TITANIC,
40.55% vs PipeLine, and +22.45% latency without segment scheduling. This runs the planner of every method
(``dssra/methods/``) alone, no training, for ``--rounds`` rounds of Algorithm 1 (one pipelined batch per
round: ``federation.local_steps=1``) on the paper's Table II network (N = 3, K = 6, J = 4; E_n^max raised as in
reproduce.sh), with the workload counted on the task's real model (its blocks, embedding and head, a real
batch through the embedding, as the server does at start-up).

Per round the on-device computation time is the largest ``compute_s`` among the clusters that train (the
slowest cluster's time on its devices, eq. 15's compute part with c0, D2D excluded); it is summed over the
rounds. The same is reported with D2D (``pipeline_s``) and for the whole modelled round delay (eq. 26). Every
method sees the same channel and device states (same seed); loss_only-style policies get the proxy loss of
``collapipe_flwr.apps.simulate``. Writes ``OUT/methods.csv`` (per seed and method), ``OUT/summary.json``,
``OUT/table.md`` (mean and spread over seeds, the margins beside the paper's) and ``OUT/accumulated.png``, and
prints ``name: value`` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reportlib import markdown as md  # noqa: E402
from reportlib import plots  # noqa: E402  (results/, first on sys.path when run as a script)
from reportlib.stats import mean_sd  # noqa: E402

from collapipe_flwr import wiring  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.dssra.method_registry import make_planner  # noqa: E402
from collapipe_flwr.fl.server.server_state import sample_hidden  # noqa: E402
from collapipe_flwr.system.state import StateSampler  # noqa: E402
from collapipe_flwr.system.workload import RoundShape, Workload, measure_workload  # noqa: E402

METHODS = ("collapipe", "collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
PAPER = {"vanilla_fl": 15.09, "titanic": 18.94, "pipeline": 40.55}  # CollaPipe's reduction vs each (Figs. 7-8)
PAPER_NO_SS_INCREASE = 22.45  # latency increase without segment scheduling
MODELS = {"translation": "transformer_small", "classification": "bert_small", "ner": "bert_small"}
COMMON = ["federation=paper", "federation.local_steps=1", "network=paper_table2", "network.uplink.energy_max_j=1000"]


def task_workload(task_name: str, overrides: list[str], model_name: str = "") -> Workload:
    """The workload the server would count for this task at start-up (one local step per round); the model is
    ``model_name`` (a conf/model/ preset), by default the task's small model."""
    model_name = model_name or MODELS[task_name]
    cfg = load_run_config([f"task={task_name}", f"model={model_name}", *COMMON, *overrides])
    task = wiring.build_task(cfg)
    model = wiring.build_model(task, cfg)
    hidden, mask = sample_hidden(task, model, cfg)
    return measure_workload(
        model.blocks,
        hidden,
        mask,
        round_shape=RoundShape(batch_size=wiring.batch_size(cfg), steps_per_round=1),
        embedding=model.embedding if cfg.federation.embedding == "trained" else None,
        head=model.head,
    )


def run_method(
    method: str, task_name: str, model_name: str, workload: Workload, rounds: int, seed: int, overrides: list[str]
) -> dict:
    """Per-round series of one method's plans: on-device compute, compute + D2D, and round delay (eq. 26)."""
    cfg = load_run_config(
        [f"task={task_name}", f"model={model_name}", f"method={method}", f"seed={seed}", *COMMON, *overrides]
    )
    planner = make_planner(cfg.method, cfg.scheduler, cfg.network, workload, seed)
    sampler = StateSampler(cfg.network, seed)
    rng = np.random.default_rng([seed, 77])
    difficulty = rng.uniform(1.0, 3.0, cfg.network.num_clusters)
    trained = np.zeros(cfg.network.num_clusters)
    compute, on_device, delay, S, m, memory, users = [], [], [], [], [], [], []
    block_bytes = workload.block_memory_bytes()  # gamma_0: one block's params, optimizer state, activations (C7)
    for t in range(rounds):
        plan = planner.plan(t, sampler.sample(t))
        rows = plan.modelled.clusters
        chosen = [c.cluster for c in plan.selected]
        compute.append(max((rows[n].compute_s for n in chosen), default=0.0))
        on_device.append(max((rows[n].pipeline_s for n in chosen), default=0.0))
        delay.append(plan.modelled.round_delay_s)
        # Table III: the largest per-device memory (a data user holds the whole model) and the data users
        memory.append(
            max(
                (block_bytes * (workload.num_blocks if rows[n].data_users is not None else max(plan.clusters[n].delta)))
                for n in chosen
            )
            / 2**20
            if chosen
            else 0.0
        )
        users.append(sum((rows[n].data_users or 1) for n in chosen))
        S.append([c.S for c in plan.clusters])
        m.append([c.m for c in plan.clusters])
        for n in chosen:
            trained[n] += 1
        planner.observe(
            plan,
            {n: float(1.0 + difficulty[n] * np.exp(-trained[n] / 10) + rng.normal(0, 0.02)) for n in chosen},
        )
    return {
        "compute_s": compute,
        "on_device_s": on_device,
        "round_delay_s": delay,
        "S": S,
        "m": m,
        "memory_mib": memory,
        "data_users": users,
    }


def reduction(ours: float, theirs: float) -> float:
    """CollaPipe's reduction against a baseline, in percent: 100 (1 - ours / theirs)."""
    return 100.0 * (1.0 - ours / theirs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (e.g. network.device.per_microbatch_s=0.01)")
    ap.add_argument("--task", choices=sorted(MODELS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="", help="model preset (conf/model/); default: the task's small model")
    args = ap.parse_intermixed_args(argv)
    model_name = args.model or MODELS[args.task]
    workload = task_workload(args.task, args.overrides, model_name)
    runs = {
        (method, seed): run_method(method, args.task, model_name, workload, args.rounds, seed, args.overrides)
        for method in METHODS
        for seed in args.seeds
    }
    totals = {
        key: {metric: float(sum(series)) for metric, series in run.items() if metric.endswith("_s")}
        for key, run in runs.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    _write_methods_csv(args.out / "methods.csv", runs, totals)
    figures: dict[str, float] = {}
    lines = [
        f"# Figs. 7-8 in the model: {args.task} ({model_name}), {args.rounds} rounds of one batch, "
        f"seeds {', '.join(map(str, args.seeds))}",
        "",
        *_margin_lines(totals, args.seeds, figures),
        "",
        *_method_lines(runs, totals, args.seeds, figures),
    ]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(
        json.dumps({"task": args.task, "rounds": args.rounds, "seeds": args.seeds, "figures": figures}, indent=2)
    )
    _plot_accumulated(runs, args, model_name)
    for name, value in figures.items():
        print(f"{name}: {value:.4g}")


def _write_methods_csv(path: Path, runs: dict, totals: dict) -> None:
    """``methods.csv``: each (method, seed)'s summed delays and mean plan."""
    with open(path, "w") as fh:
        fh.write("method,seed,compute_s,on_device_s,round_delay_s,mean_S,mean_m\n")
        for (method, seed), tot in totals.items():
            run = runs[(method, seed)]
            fh.write(
                f"{method},{seed},{tot['compute_s']:.6f},{tot['on_device_s']:.6f},{tot['round_delay_s']:.6f},"
                f"{np.mean(run['S']):.3f},{np.mean(run['m']):.3f}\n"
            )


def _margin_lines(totals: dict, seeds: list[int], figures: dict[str, float]) -> list[str]:
    """The table of CollaPipe's reductions against each baseline, per measure, beside the paper's."""
    lines = [
        *md.head("| measure | CollaPipe vs | ours: reduction, mean +- sd over seeds | paper |"),
    ]
    for metric in ("compute_s", "on_device_s", "round_delay_s"):
        for base in METHODS[1:]:
            per_seed = [reduction(totals[("collapipe", s)][metric], totals[(base, s)][metric]) for s in seeds]
            mean, sd = mean_sd(per_seed)
            figures[f"reduction_pct_{metric}_vs_{base}"] = mean
            if base == "collapipe_no_ss":
                as_reduction = reduction(1, 1 + PAPER_NO_SS_INCREASE / 100)
                paper = f"latency +{PAPER_NO_SS_INCREASE}% without SS (= {as_reduction:.2f}% reduction)"
            else:
                paper = f"{PAPER[base]}%"
            lines.append(f"| {metric} | {base} | {mean:.2f}% +- {sd:.2f} | {paper if metric == 'compute_s' else '-'} |")
    return lines


def _method_lines(runs: dict, totals: dict, seeds: list[int], figures: dict[str, float]) -> list[str]:
    """The table of each method's accumulated compute, mean plan, memory and data users (Table III)."""
    lines = [
        *md.head(
            "| method | accumulated on-device compute (s), mean +- sd | mean S | mean m | largest per-device memory "
            "(MiB, Table III) | data users per round (Table III) |"
        ),
    ]
    for method in METHODS:
        mean, sd = mean_sd([totals[(method, s)]["compute_s"] for s in seeds])
        mS = np.mean([np.mean(runs[(method, s)]["S"]) for s in seeds])
        mm = np.mean([np.mean(runs[(method, s)]["m"]) for s in seeds])
        mem = np.mean([np.mean(runs[(method, s)]["memory_mib"]) for s in seeds])
        du = np.mean([np.mean(runs[(method, s)]["data_users"]) for s in seeds])
        lines.append(f"| {method} | {mean:.1f} +- {sd:.1f} | {mS:.2f} | {mm:.2f} | {mem:.0f} | {du:.1f} |")
        figures[f"accumulated_compute_s_{method}"] = mean
        figures[f"device_memory_mib_{method}"] = float(mem)
        figures[f"data_users_{method}"] = float(du)
    return lines


def _plot_accumulated(runs: dict, args: argparse.Namespace, model_name: str) -> None:
    """``accumulated.png``: each method's accumulated on-device compute over rounds, mean over seeds."""
    curves = {method: [np.cumsum(runs[(method, s)]["compute_s"]) for s in args.seeds] for method in METHODS}
    title = f"{args.task}: {model_name}, mean of {len(args.seeds)} seeds"
    ylabel = "accumulated on-device computation time (s)"
    plots.mean_curves(curves, ylabel, title, args.out / "accumulated.png")


if __name__ == "__main__":
    main()
