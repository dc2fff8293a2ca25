"""Pipeline overhead on this machine: plain one-process training step vs ClusterPipeline over Ray actors.

BERT-small (6 blocks, hidden 256, 4 heads, FFN 1024, bert-base-chinese vocabulary size), batch 32 x 64
tokens, token-classification head, Adam. Prints one ``name: value`` per line:

- ``plain_step_s``: median seconds of one training step of the whole model in this process, with the
  faster of 1 torch thread and all cores (both timed first and printed);
- ``step_ratio_S{S}_m{m}``: median pipelined step seconds / median plain step seconds, S in --S (default
  1 2 3, balanced delta), m in --m (default 1 2 4 8), Ray backend, --steps steps after --warmup warm-up
  steps; pipelined and plain steps alternate, so both see the same background load (the machine may be
  shared); ``step_ratio_fastest_S{S}_m{m}``: the same with the fastest step of each (less sensitive to
  bursts of load from other jobs);
- the two fair figures (``--fair``, on by default; :func:`fair_figures`): ``overhead_ratio_equal_cores`` (S = 1,
  m = 1, one device actor with one core and one torch thread, the CU on one thread, over the plain model on one
  thread: what the framework costs) and ``device_speedup_S2_m4`` (S = 2, m = 4 with one core per device over
  S = 1, m = 1 with one core: what a second device buys; GPipe's limit is (m + S - 1) / (S m) = 0.625), and the
  same two as the median of each iteration's own ratio (``*_paired``: steps seconds apart, so a machine whose speed
  drifts over minutes moves them less than a ratio of medians); the fair figures run ``--fair-runs`` times (default
  5), each with its own actors, and ``overhead_ratio_equal_cores_paired_median_of_runs`` is the median of the
  runs' paired overheads (run_all's target, <= 1.05x, issue 64); the other fair figures are the first run's; with the
  CU's view of both steps as a profile: ``fair_S{S}_m{m}_<phase>_s`` (median seconds of embed / forward / head /
  backward / update / total, and each device's own compute ``device<k>_compute``) and where its core time goes
  (``fair_S{S}_m{m}_cpu_<group>_s``: median CPU seconds per step of the CU's process, the step's device actors,
  the other pipelines' idle actors and the rest of Ray, :class:`CpuMeter`); and S = 2, m = 4 against what its own
  compute allows (:func:`step_bound`, from the devices' traces of each step): ``fair_S2_m4_critical_path_s`` (the
  GPipe critical path of the measured calls with hand-overs that take no time), ``fair_S2_m4_bound_s`` (that plus
  the CU's embed, head and update), ``fair_S2_m4_over_bound`` (the step over it: hand-overs, Ray calls, the CU's
  other work), ``fair_S2_m4_microbatch_inflation`` (the devices' compute at m = 4 over S = 1, m = 1's) and
  ``device_speedup_S2_m4_bound`` (bound_s over the S = 1, m = 1 step: the speed-up the measured calls allow);
- what the machine gives two devices computing at once (:func:`pair_figures`, with the fair figures): one device's
  work of S = 2, m = 4 in two processes pinned to two cores, timed alone and both at once in alternation:
  ``machine_pair_slowdown`` (1 on two independent cores) and ``gpipe_limit_S2_m4_at_pair_slowdown`` (GPipe's
  S = 2, m = 4 limit when calls that overlap take that much longer, :func:`gpipe_limit_S2`: modelled from it);
- ``device_speedup_S2_m4_quota`` (:func:`quota_figures`, with the fair figures, where cgroup CPU quotas work):
  the same speed-up with every device an emulated one of ``--device-cores`` cores (default 0.7) under the testbed's
  CPU quota, so the CU and Ray keep a share of their own as on a CU's own box (``quota_step_s_S{S}_m{m}``, and
  the cores each device's cgroup granted, read back);
- ``mem_ratio_S{S}``: max over devices of (params + Adam state + peak saved activations) / the same
  count for the plain model (embedding + encoder + head, whole batch), both measured with
  ``SavedTensorMeter`` / ``memory_report``; ``mem_ratio_encoder_S{S}`` compares with the plain
  encoder alone (a stricter view: the CU keeps the embedding, the server the head).

Threads: the plain model is timed with 1 thread and with all cores; each device actor is pinned to its
own cores with ``--pin auto|true`` (runtime.pin_threads, default false: ``executors.core_sets``) with as many torch
threads, else uses ``max(1, (cores - 1) // S)`` (``default_actor_threads``; ``--actor-threads`` overrides);
the CU process keeps all cores for the embedding and the head, which run while the actors wait.

Run: ``python benchmarks/pipeline_overhead.py [--S 1 2 3] [--m 1 2 4 8] [--pin auto|true|false]`` (4-5 minutes
on 2 idle cores; far longer when they are shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent, HERE):  # the package, and overhead/ beside this script (also when loaded by path)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from overhead.bounds import gpipe_limit_S2, step_bound  # noqa: E402, F401  (read by tests/pipeline/test_schedule_critical_path.py)
from overhead.fair import fair_figures  # noqa: E402
from overhead.model import DELTAS, SPEC, PlainTrainer, make_batch, make_model, plain_model_figures  # noqa: E402
from overhead.pair import pair_figures  # noqa: E402
from overhead.quota import quota_figures  # noqa: E402

from collapipe_flwr.pipeline.cluster import ClusterPipeline  # noqa: E402
from collapipe_flwr.pipeline.executors import core_sets, default_actor_threads, usable_cores, usable_cores_list  # noqa: E402
from collapipe_flwr.pipeline.head import LocalHead  # noqa: E402
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, RuntimeSpec  # noqa: E402
from collapipe_flwr.testbed import cpu_quota_available  # noqa: E402


def pipeline_figures(
    batch,
    S: int,
    ms,
    warmup: int,
    steps: int,
    threads: int | None,
    plain: PlainTrainer,
    spec: RuntimeSpec = RuntimeSpec(backend="ray", precision="fp32", pin_threads="false", handoff="auto"),  # noqa: B008
):
    """Per m: (median pipelined step s, median plain step s measured in alternation with it), and the
    largest per-device peak bytes, S devices of ``DELTAS[S]`` run by ``spec`` (the Ray backend, fp32). Alternating
    the two keeps the ratio fair when other jobs load the CPU."""
    model = make_model()
    head = LocalHead(model.head, SPEC)
    medians = {}
    with ClusterPipeline(
        model.embedding,
        model.blocks,
        DELTAS[S],
        SPEC,
        runtime=ClusterRuntime(spec, actor_threads=threads),
    ) as pipe:
        for m in ms:
            piped, plain_times = [], []
            for i in range(warmup + steps):
                result = pipe.train_step(batch, m, head)
                plain_s = plain.step(batch)
                if i >= warmup:
                    piped.append(result.timings.total)
                    plain_times.append(plain_s)
            medians[m] = (statistics.median(piped), statistics.median(plain_times), min(piped), min(plain_times))
        peak = max(r["peak_bytes"] for r in pipe.memory_report())
    return medians, peak


def main() -> None:
    args = _arguments()
    import ray

    cores = usable_cores()
    torch.set_num_threads(cores)
    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    batch = make_batch(args.batch, args.seq_len)
    print(f"cores: {cores}")
    print(f"pin_threads: {args.pin}")
    print(f"load_avg_1min: {os.getloadavg()[0]:.2f}")
    if args.fair or args.fair_only:
        _print_fair_figures(args, batch)
        if args.fair_only:
            print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")
            ray.shutdown()
            return
    _print_pipeline_figures(args, batch, cores)
    print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")
    ray.shutdown()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--S", "--segments", dest="segments", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--m", "--micro-batches", dest="micro_batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--pin",
        choices=["auto", "true", "false"],
        default="false",
        help="runtime.pin_threads (default false, as conf/): each device actor on its own cores (auto: >= S cores)",
    )
    parser.add_argument(
        "--handoff",
        choices=["auto", "shm", "object_store"],
        default="auto",
        help="runtime.handoff (default auto, as conf/): how tensors move between the CU and its device actors",
    )
    parser.add_argument(
        "--device-cores",
        type=float,
        default=0.7,
        help="cores each device gets in the quota figure (cgroup CPU quota; 0: skip it); with S = 2 on this 2-core "
        "host, 0.7 leaves the CU and Ray 0.6 of a core",
    )
    parser.add_argument(
        "--fair-runs",
        type=int,
        default=5,
        help="runs of the fair figures, each with its own actors; the overhead's target reads the median of their "
        "paired ratios (default 5)",
    )
    parser.add_argument("--no-fair", dest="fair", action="store_false", help="skip the two fair figures")
    parser.add_argument("--fair-only", action="store_true", help="only the two fair figures")
    parser.add_argument(
        "--actor-threads",
        type=int,
        default=None,
        help="torch threads per device actor (default max(1, (cores - 1) // S))",
    )
    return parser.parse_args()


def _print_fair_figures(args: argparse.Namespace, batch) -> None:
    """The fair figures, the two-device machine figures and (where cgroup quotas work) the quota figure."""
    fair_pin = "true" if args.pin == "false" else args.pin  # one core per device actor
    runs = [fair_figures(batch, args.warmup, args.steps, fair_pin, args.handoff) for _ in range(args.fair_runs)]
    for name, value in runs[0].items():
        print(f"{name}: {value:.4f}")
    # issue 64: the overhead's target reads the median, over runs each with its own actors, of each run's paired ratio
    paired = [run["overhead_ratio_equal_cores_paired"] for run in runs]
    print(f"overhead_ratio_equal_cores_paired_runs: {len(paired)}")
    print(f"overhead_ratio_equal_cores_paired_median_of_runs: {statistics.median(paired):.4f}")
    rows = max(1, args.batch // 4)  # S = 2, m = 4: one device's micro-batch and blocks
    for name, value in pair_figures(rows, args.seq_len, DELTAS[2][0]).items():
        print(f"{name}: {value:.4f}")
    reason = cpu_quota_available() if args.device_cores > 0 else "--device-cores 0"
    if reason is None:
        figures = quota_figures(batch, args.warmup, args.steps, args.device_cores, fair_pin, args.handoff)
        for name, value in figures.items():
            print(f"{name}: {value:.4f}")
    else:
        print(f"quota figure skipped ({reason})")


def _print_pipeline_figures(args: argparse.Namespace, batch, cores: int) -> None:
    """The plain model at 1 thread and all cores, then every (S, m)'s step and memory ratios against it."""
    plain_1, _, _ = plain_model_figures(batch, args.warmup, args.steps, threads=1)
    plain_n, plain_peak, plain_enc_peak = plain_model_figures(batch, args.warmup, args.steps, threads=cores)
    torch.set_num_threads(cores)
    plain_threads = 1 if plain_1 <= plain_n else cores
    print(f"plain_step_s_threads1: {plain_1:.4f}")
    print(f"plain_step_s_threads{cores}: {plain_n:.4f}")
    print(f"plain_threads: {plain_threads}")
    print(f"plain_peak_bytes: {plain_peak}")
    plain = PlainTrainer(plain_threads)
    spec = RuntimeSpec(backend="ray", precision="fp32", pin_threads=args.pin, handoff=args.handoff)
    all_plain = []
    for S in args.segments:
        sets = core_sets(usable_cores_list(), S, args.pin)
        threads = args.actor_threads or (len(sets[0]) if sets else default_actor_threads(S))
        medians, peak = pipeline_figures(
            batch, S, args.micro_batches, args.warmup, args.steps, args.actor_threads, plain, spec
        )
        print(f"actor_threads_S{S}: {threads}")
        print(f"actor_cores_S{S}: {' '.join(','.join(map(str, c)) for c in sets) if sets else 'any'}")
        for m, (seconds, plain_s, fastest, plain_fastest) in medians.items():
            all_plain.append(plain_s)
            print(f"step_s_S{S}_m{m}: {seconds:.4f}")
            print(f"plain_step_s_paired_S{S}_m{m}: {plain_s:.4f}")
            print(f"step_ratio_S{S}_m{m}: {seconds / plain_s:.3f}")
            print(f"step_ratio_fastest_S{S}_m{m}: {fastest / plain_fastest:.3f}")
        print(f"mem_ratio_S{S}: {peak / plain_peak:.3f}")
        print(f"mem_ratio_encoder_S{S}: {peak / plain_enc_peak:.3f}")
    print(f"plain_step_s: {statistics.median(all_plain):.4f}")


if __name__ == "__main__":
    main()
