"""Federated CollaPipe against the central reference on the same number of training examples.

    python benchmarks/convergence.py --task translation [--examples 25600] [--clusters 2] [--local-steps 20]
        [--backend local|ray] [--precision auto] [--optimizer-state keep] [--server-optimizer fedavg]
        [--skip-central] [--json FILE] [hydra overrides ...]

Federated: N IID clusters (flwr-datasets IID partitioner), S = 2 segments (delta = (ceil(L/2), floor(L/2)))
and m = 4 micro-batches per cluster, the decoder on the server behind the real gRPC data plane, FedAvg (or
``--server-optimizer``) every ``--local-steps`` steps. It runs the real server state and the real CU round
(``ServerState`` + ``train_round``, the code the Flower apps call), the CUs one after another in this
process, so the figure does not depend on how busy the machine is. Central: the same model in one piece
(``train_central.train``) for ``examples / b`` steps, the same model.lr_schedule over its own step count.
Both are evaluated on the whole validation split with the same ``task.evaluate``.

Prints ``name: value`` lines: ``federated_<metric>``, ``central_<metric>``, ``ratio`` (federated / central),
the example counts and the wall seconds of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flwr.app import RecordDict  # noqa: E402

from collapipe_flwr import (
    train_central,  # noqa: E402
    wiring,  # noqa: E402
)
from collapipe_flwr.config import RunConfig, load_run_config  # noqa: E402
from collapipe_flwr.dssra.plan import ClusterPlan  # noqa: E402
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, release_run, run_key_of, train_round  # noqa: E402
from collapipe_flwr.fl.cu.state_store import CUStateStore  # noqa: E402
from collapipe_flwr.fl.messages import NUM_EXAMPLES, unpack_weights  # noqa: E402
from collapipe_flwr.fl.server.server_state import ServerState  # noqa: E402
from collapipe_flwr.precision import autocast, resolve_precision  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides applied to both runs (e.g. model.optimizer.lr=0.002)")
    p.add_argument("--task", default="translation", choices=("translation", "classification", "ner"))
    p.add_argument("--examples", type=int, default=0, help="training examples seen in all (0 = 400 central steps)")
    p.add_argument("--clusters", type=int, default=2)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--m", type=int, default=4)
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--optimizer-state", default="keep", choices=("keep", "reset"))
    p.add_argument("--server-optimizer", default="fedavg")
    p.add_argument("--decoder-update", default="per_cu", choices=("per_cu", "joint"))
    p.add_argument("--skip-central", action="store_true")
    p.add_argument("--skip-federated", action="store_true")
    p.add_argument("--json", default="")
    return p.parse_intermixed_args(argv)


def _federated_config(args: argparse.Namespace, base: list[str]) -> tuple[RunConfig, int]:
    """(run config, T): enough rounds of N clusters x local steps to see --examples examples once."""
    b = load_run_config(base).task.batch_size
    steps_total = args.examples // b  # CU steps over all clusters
    rounds = max(1, math.ceil(steps_total / (args.clusters * args.local_steps)))
    cfg = load_run_config(
        [
            *base,
            "network=small",
            f"federation.num_clusters={args.clusters}",
            f"federation.num_rounds={rounds}",
            f"federation.local_steps={args.local_steps}",
            f"runtime.backend={args.backend}",
            f"runtime.precision={args.precision}",
            f"federation.optimizer_state={args.optimizer_state}",
            f"federation.server_optimizer={args.server_optimizer}",
            f"federation.decoder_update={args.decoder_update}",
        ]
    )
    return cfg, rounds


def _train_clusters(
    args: argparse.Namespace, server: ServerState, t: int, delta: tuple, states: dict, store: CUStateStore
) -> list:
    """Round t of every cluster (S = 2, the given delta_k, m = --m): [(n, weights, metrics)] in cluster order; the
    CUs share one process's state store."""

    def one_cluster(n: int):
        plan = ClusterPlan(cluster=n, selected=True, channel=0, power_w=0.1, S=2, m=args.m, delta=delta)
        ins = server.instructions_for(t, plan)
        record, metrics = train_round(
            store, ClusterIdentity(n, args.clusters), server.global_model.array_record(), ins, state=states[n]
        )
        metrics = metrics.to_record()  # the report as it travels (RoundReport.to_record)
        return n, unpack_weights(record), metrics

    if args.decoder_update == "joint":  # the barrier needs every CU at once: one thread per CU
        with ThreadPoolExecutor(args.clusters) as pool:
            return list(pool.map(one_cluster, range(args.clusters)))
    # one CU after another: the decoder sees the clusters' steps in a fixed order
    return [one_cluster(n) for n in range(args.clusters)]


def _round_examples_and_train_s(args: argparse.Namespace, results: list) -> tuple[int, float]:
    """(examples the CUs saw, training seconds of the round: the slowest CU when joint, else their sum)."""
    seen, train_s = 0, 0.0
    for _, _, metrics in results:
        seen += int(metrics["num-examples"])
        train_s = (
            max(train_s, float(metrics["seconds-train"]))
            if args.decoder_update == "joint"
            else train_s + float(metrics["seconds-train"])
        )
    return seen, train_s


def _absorb(server: ServerState, t: int, results: list) -> None:
    """Round t's replies [(n, weights, metrics)] folded in as the strategy folds them, then the new global model."""
    fold = server.global_model.new_round()
    for n, parts, metrics in results:
        fold.add(n, parts, float(metrics[NUM_EXAMPLES]))
    server.absorb_round(t, fold, {n: float(metrics["train-loss"]) for n, _, metrics in results})


def federated(args, base: list[str]) -> dict:
    cfg, rounds = _federated_config(args, base)
    torch.set_num_threads(cfg.runtime.torch_threads)
    server = ServerState.build(cfg)
    L = len(server.model.blocks)
    K = len(server.planner.devices_of(0))
    delta = tuple([math.ceil(L / 2), L // 2] + [0] * (K - 2))
    states = {n: RecordDict() for n in range(args.clusters)}
    store = CUStateStore()  # this process's CU state, shared by the CUs (as in one worker of Flower's simulation)
    store.cached_task(cfg)  # built once, before CU threads would race to build it
    t0 = time.monotonic()
    seen, overheads = 0, []
    try:
        for t in range(1, rounds + 1):
            server.decoder.open_round(t, list(range(args.clusters)))
            t_round = time.monotonic()
            results = _train_clusters(args, server, t, delta, states, store)
            examples, train_s = _round_examples_and_train_s(args, results)
            seen += examples
            server.decoder.close_round()
            _absorb(server, t, results)
            overheads.append(time.monotonic() - t_round - train_s)
            loss = sum(m["train-loss"] for _, _, m in results) / len(results)
            print(
                f"round {t}/{rounds} loss {loss:.3f} overhead {overheads[-1]:.2f}s "
                f"elapsed {time.monotonic() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
        train_seconds = time.monotonic() - t0
        with autocast(resolve_precision(args.precision)):
            metrics = server.evaluate()
    finally:
        for n in range(args.clusters):
            release_run(store, ClusterIdentity(n, args.clusters), run_key_of(cfg, None), K)
        server.shutdown()
    return {
        "metrics": metrics,
        "examples": seen,
        "rounds": rounds,
        "train_seconds": train_seconds,
        "overhead_s_median": sorted(overheads)[len(overheads) // 2],
        "wall_seconds": time.monotonic() - t0,
    }


def central(args, base: list[str]) -> dict:
    cfg = load_run_config(base)
    torch.set_num_threads(cfg.runtime.torch_threads)
    task = wiring.build_task(cfg)
    torch.manual_seed(cfg.seed)
    model = task.build_model(cfg.seed)
    steps = args.examples // cfg.task.batch_size
    t0 = time.monotonic()
    precision = resolve_precision(args.precision)
    indices = list(range(len(task.train_examples())))
    eval_cfg = dataclasses.replace(cfg.eval, max_examples=0)
    settings = train_central.TrainSettings(10_000.0, steps, precision, quiet=True)
    summary = train_central.train(task, model, settings, indices, cfg.seed, eval_cfg)
    for part in (model.embedding, model.blocks, model.head):
        part.eval()
    with torch.no_grad(), autocast(precision):
        metrics = task.evaluate(model, max_examples=0, batch_size=cfg.eval.batch_size, beam_size=cfg.eval.beam_size)
    return {
        "metrics": metrics,
        "examples": summary["steps"] * cfg.task.batch_size,
        "steps": summary["steps"],
        "wall_seconds": time.monotonic() - t0,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    base = [f"task={args.task}", *args.overrides]
    if not args.examples:
        args.examples = 400 * load_run_config(base).task.batch_size
    out = {"task": args.task, "examples": args.examples, "args": vars(args)}
    if not args.skip_federated:
        out["federated"] = federated(args, base)
    if not args.skip_central:
        out["central"] = central(args, base)
    task_metric = {"translation": "bleu", "classification": "accuracy", "ner": "f1"}[args.task]
    metric = task_metric
    for kind in ("federated", "central"):
        if kind in out:
            print(f"{kind}_{metric}: {out[kind]['metrics'][metric]:.4f}")
            print(f"{kind}_examples: {out[kind]['examples']}")
            print(f"{kind}_wall_s: {out[kind]['wall_seconds']:.0f}")
    if "federated" in out:
        print(f"round_overhead_s_median: {out['federated']['overhead_s_median']:.3f}")
    if "federated" in out and "central" in out:
        ratio = out["federated"]["metrics"][metric] / max(out["central"]["metrics"][metric], 1e-9)
        out["ratio"] = ratio
        print(f"ratio: {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
