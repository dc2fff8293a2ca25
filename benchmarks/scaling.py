"""Scaling: modelled and measured round delay as the number of CUs N and devices per cluster K grow, and the
server's memory vs N (issue 16).

    python benchmarks/scaling.py            # N = 3, 10, 30 (K = 3) and K = 2, 8 (N = 3); 3 rounds each
    python benchmarks/scaling.py --quick    # N = 3, 10 and K = 3, 6; 2 rounds (a check, not figures)

Each configuration runs the real server (``run_server``: strategy, DSSRA planner, data plane, aggregation,
evaluation) in a fresh process, with the N CUs' real handlers (``client_main``, local backend) in one child
process that answers them one after the other: Flower's own SuperLink / SuperNodes are left out (30
SuperNodes do not fit on 2 cores in minutes), so the server process holds only the server, and its RSS
(psutil, sampled every 50 ms) is the server's memory. The grid has Flower's push/pull API: the server pulls
each CU's reply as it arrives and folds it into the round's running sum (``fl/server/reply_stream.py``).
Tiny model (``transformer_tiny``), one local step, batch 8, evaluation on 16 examples.
``network.num_channels`` is set to N so no CU sits out for lack of a channel (J >= N); the number of CUs
DSSRA still picks per round is printed (``cus_trained_N*``).

Figures (``name: value``):
- ``round_wall_s_N*`` / ``round_wall_s_K*``: measured wall-clock per round (``measured_s.round_s`` of
  rounds.jsonl), mean over the rounds after the first (the first starts the CUs' sessions);
- ``server_s_N*``: the server's own work per round (plan + aggregate), the part that must not grow with N^2;
- ``modelled_delay_s_N*`` / ``_K*``: eq. (26)'s round delay (``modelled.round_delay_s``), mean over rounds;
- ``round_wall_growth_per_cu_ratio``: (wall at N_max / wall at N_min) / (N_max / N_min); <= 1 means the
  round grows no faster than linearly in N (the CUs answer serially here, so linear is the expectation);
- ``server_rss_mb_N*`` (peak) and ``server_rss_growth_ratio``: peak server RSS at N_max / at N_min (flat: ~1);
- ``server_rss_mb_per_round_N*``: RSS growth from the end of round 1 to the end of the last round, per round
  (state kept forever would show here).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cu_host(conn, num_clusters: int, data_dir: str, run_id: int) -> None:
    """Child process: the N CUs' handlers; receives lists of messages, answers with the replies."""
    from flwr.app import Context, RecordDict

    from collapipe_flwr.fl import messages
    from collapipe_flwr.fl.cu import client_main
    from collapipe_flwr.fl.cu.state_store import CUStateStore
    from collapipe_flwr.flower_internals import TaskIdentity

    handlers = {
        messages.HELLO: client_main.handle_hello,
        messages.TRAIN: client_main.handle_train,
        messages.RELEASE: client_main.handle_release,
    }
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 1
    contexts = {
        101 + n: Context(
            run_id=run_id,
            node_id=101 + n,
            node_config={"partition-id": n, "num-partitions": num_clusters, "data-dir": data_dir},
            state=RecordDict(),
            run_config={},
        )
        for n in range(num_clusters)
    }
    store = CUStateStore()  # the child is one CU process: one state store for its N CUs
    while True:
        batch = conn.recv()
        if batch is None:
            return
        for m in batch:  # each reply on its own, as a SuperNode's reaches the SuperLink
            conn.send(handlers[m.metadata.message_type](m, contexts[m.metadata.dst_node_id], store))


class ChildProcessGrid:
    """A Flower Grid whose N CUs run in one child process, in node order (the server's process holds no CU).

    Flower's push/pull API, as the real grids have it: ``push_messages`` hands the batch to the child, which
    answers one message after the other; ``pull_messages`` takes the replies asked for out of the pipe, so the
    server holds a reply only once it pulled it. ``after_train`` is called when a train batch's last reply is
    pulled (the end of the round's training)."""

    pull_interval = 0.01  # seconds between the server's pulls (Flower's InMemoryGrid: 0.1); short, as the child waits
    # for each reply to be pulled before it runs the next CU

    def __init__(self, num_clusters: int, data_dir: str, run_id: int = 9) -> None:
        from collapipe_flwr.flower_internals import TaskIdentity

        self.run_id, self.num_clusters, self._next = run_id, num_clusters, 1
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_cu_host, args=(child, num_clusters, data_dir, run_id), daemon=True)
        self._proc.start()
        self._ready: dict[str, object] = {}  # replies read from the pipe before they were asked for
        self._train: set[str] = set()  # the train messages without a pulled reply
        self.after_train = lambda: None
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 1

    def get_node_ids(self) -> list[int]:
        return [101 + n for n in range(self.num_clusters)]

    def push_messages(self, messages) -> list[str]:
        from collapipe_flwr.fl import messages as kinds

        batch = sorted(messages, key=lambda m: m.metadata.dst_node_id)
        for msg in batch:
            msg.metadata.__dict__["_message_id"] = f"m{self._next}"
            msg.metadata.__dict__["_run_id"] = self.run_id
            self._next += 1
        ids = [m.metadata.message_id for m in batch]
        self._train.update(i for i, m in zip(ids, batch) if m.metadata.message_type == kinds.TRAIN)
        if batch:
            self._conn.send(batch)
        return ids

    def pull_messages(self, message_ids) -> list:
        wanted = set(message_ids)
        out = [self._ready.pop(i) for i in wanted if i in self._ready]
        while not out and self._conn.poll():
            reply = self._conn.recv()
            asked = reply.metadata.reply_to_message_id
            if asked in wanted:
                out.append(reply)
            else:
                self._ready[asked] = reply
        answered = {r.metadata.reply_to_message_id for r in out}
        if answered & self._train:
            self._train -= answered
            if not self._train:
                self.after_train()
        return out

    def send_and_receive(self, messages, timeout=None) -> list:
        pending = list(self.push_messages(messages))
        replies: list = []
        while pending:
            replies.extend(self.pull_messages(pending))
            answered = {r.metadata.reply_to_message_id for r in replies}
            pending = [i for i in pending if i not in answered]
            if pending:
                time.sleep(self.pull_interval)
        return replies

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(timeout=30)


def run_one(n: int, k: int, rounds: int, data_dir: str, out_dir: str) -> dict:
    """One configuration, server in this process; per-round figures from rounds.jsonl and peak RSS."""
    import psutil

    from collapipe_flwr.fl.server.server_main import run_server

    me = psutil.Process(os.getpid())
    peak = [me.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], me.memory_info().rss)

    rss_after_round: list[float] = []
    overrides = (
        f"task=translation model=transformer_tiny federation=tiny network=small federation.num_clusters={n} "
        f"federation.num_rounds={rounds} federation.local_steps=1 network.num_channels={n} "
        f"network.devices_per_cluster={k} runtime.backend=local runtime.precision=fp32 task.batch_size=8 "
        f"eval.max_examples=16 run_name=scale_N{n}_K{k}"
    )
    grid = ChildProcessGrid(n, data_dir)
    grid.after_train = lambda: rss_after_round.append(me.memory_info().rss)  # the end of each round's training
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        folder = run_server(grid, {"overrides": overrides, "data-dir": data_dir, "output-dir": out_dir})
    finally:
        stop.set()
        grid.close()
    if folder is None:
        raise RuntimeError(f"the run N={n} K={k} failed")
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    trained = [r for r in records if r.get("round", 0) >= 1]
    return {
        "round_s": [r["measured_s"]["round_s"] for r in trained],
        "server_s": [r["measured_s"]["plan_s"] + r["measured_s"]["aggregate_s"] for r in trained],
        "modelled_s": [r["modelled"]["round_delay_s"] for r in trained],
        "cus": [len(r["clients"]) for r in trained],
        "peak_rss_mb": peak[0] / 2**20,
        "rss_mb": [x / 2**20 for x in rss_after_round],
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def measure(n: int, k: int, rounds: int, timeout_s: float) -> dict:
    """``run_one`` in a fresh process (clean RSS), its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--one", f"{n},{k}", "--rounds", str(rounds), "--out", tmp]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"N={n} K={k}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 3, 10 and K = 3, 6, two rounds")
    ap.add_argument("--clusters", default=None, help="comma-separated N values (default 3,10,30)")
    ap.add_argument("--devices", default=None, help="comma-separated K values (default 2,8), at N = 3")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per run (default 3; --quick 2)")
    ap.add_argument("--data-dir", default=str(ROOT / "data"))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each configuration may take")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: "N,K" in this process
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 3)
    if args.one:
        n, k = (int(x) for x in args.one.split(","))
        result = run_one(n, k, rounds, args.data_dir, args.out)
        print(json.dumps(result))
        return 0
    clusters = [int(x) for x in (args.clusters or ("3,10" if args.quick else "3,10,30")).split(",")]
    devices = [int(x) for x in (args.devices or ("3,6" if args.quick else "2,8")).split(",")]
    print(f"rounds_per_run: {rounds}")
    by_n: dict[int, dict] = {}
    for n in clusters:
        t0 = time.monotonic()
        r = by_n[n] = measure(n, 3, rounds, args.timeout)
        steady = slice(1, None) if len(r["round_s"]) > 1 else slice(None)
        print(f"round_wall_s_N{n}: {_mean(r['round_s'][steady]):.3f}")
        print(f"first_round_wall_s_N{n}: {r['round_s'][0]:.3f}")
        print(f"server_s_N{n}: {_mean(r['server_s'][steady]):.4f}")
        print(f"modelled_delay_s_N{n}: {_mean(r['modelled_s']):.3f}")
        print(f"cus_trained_N{n}: {_mean(r['cus']):.1f}")
        print(f"server_rss_mb_N{n}: {r['peak_rss_mb']:.1f}")
        rss = r["rss_mb"]
        per_round = (rss[-1] - rss[0]) / max(rounds - 1, 1) if len(rss) >= 2 else 0.0
        print(f"server_rss_mb_per_round_N{n}: {per_round:.2f}")
        print(f"took_s_N{n}: {time.monotonic() - t0:.0f}", flush=True)
    lo, hi = min(by_n), max(by_n)
    if hi > lo:
        steady_wall = {n: _mean(by_n[n]["round_s"][1:] or by_n[n]["round_s"]) for n in (lo, hi)}
        print(f"round_wall_growth_per_cu_ratio: {steady_wall[hi] / steady_wall[lo] / (hi / lo):.3f}")
        print(f"server_rss_growth_ratio: {by_n[hi]['peak_rss_mb'] / by_n[lo]['peak_rss_mb']:.3f}")
    for k in devices:
        r = by_n[3] if k == 3 and 3 in by_n else measure(3, k, rounds, args.timeout)  # N = 3 ran at K = 3
        print(f"round_wall_s_K{k}: {_mean(r['round_s'][1:] or r['round_s']):.3f}")
        print(f"modelled_delay_s_K{k}: {_mean(r['modelled_s']):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
