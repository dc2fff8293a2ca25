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
  drifts over minutes moves them less than a ratio of medians), with the
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
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collapipe_flwr.models.bert import BertSplitConfig, build_bert  # noqa: E402
from collapipe_flwr.pipeline.cluster import ClusterPipeline  # noqa: E402
from collapipe_flwr.pipeline.executors import (  # noqa: E402
    core_sets,
    default_actor_threads,
    usable_cores,
    usable_cores_list,
)
from collapipe_flwr.pipeline.head import LocalHead  # noqa: E402
from collapipe_flwr.pipeline.memory import SavedTensorMeter, optimizer_state_bytes, param_bytes  # noqa: E402
from collapipe_flwr.pipeline.optim import OptimizerSpec  # noqa: E402
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, RuntimeSpec  # noqa: E402
from collapipe_flwr.pipeline.schedule import gpipe_critical_path_s  # noqa: E402
from collapipe_flwr.pipeline.sparse_embedding import densify_gradients, use_sparse_gradients  # noqa: E402
from collapipe_flwr.system.profile import DeviceEmulation  # noqa: E402
from collapipe_flwr.testbed import cpu_quota_available  # noqa: E402

VOCAB, HIDDEN, HEADS, FFN, LAYERS, LABELS = 21128, 256, 4, 1024, 6, 7
DELTAS = {1: (6,), 2: (3, 3), 3: (2, 2, 2)}
SPEC = OptimizerSpec(name="adam", lr=1e-4)


def make_model():
    torch.manual_seed(0)
    return build_bert(BertSplitConfig(VOCAB, HIDDEN, HEADS, FFN, LAYERS, 0.1, 128, "token", LABELS))


def make_batch(b: int, t: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1, VOCAB, (b, t), generator=g),
        "attention_mask": torch.ones(b, t, dtype=torch.long),
        "labels": torch.randint(0, LABELS, (b, t), generator=g),
    }


def plain_model_figures(batch, warmup: int, steps: int, threads: int) -> tuple[float, int, int]:
    """(median step seconds, peak bytes of the whole model, peak bytes of the encoder alone).

    Saved-tensor hooks do not nest (the innermost wins), so embedding, encoder and head are metered one
    after the other and summed."""
    torch.set_num_threads(threads)
    model = make_model().train()
    use_sparse_gradients(model.embedding)  # as the CU's embedding (PlainTrainer)
    optimizers = [SPEC.build(part.parameters()) for part in model.parts()]
    params = list(model.parameters())
    times, peak_all, peak_enc = [], 0, 0
    for i in range(warmup + steps):
        start = time.perf_counter()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        with SavedTensorMeter(exclude=params) as emb_meter:
            hidden = model.embedding(batch["input_ids"])
        with SavedTensorMeter(exclude=params) as enc_meter:
            for block in model.blocks:
                hidden = block(hidden, batch["attention_mask"])
        with SavedTensorMeter(exclude=params) as head_meter:
            loss_sum, count = model.head.loss_terms(hidden, batch["attention_mask"], batch)
        (loss_sum / count).backward()
        densify_gradients(model.embedding)
        for opt in optimizers:
            opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        peak_all = max(peak_all, emb_meter.bytes + enc_meter.bytes + head_meter.bytes)
        peak_enc = max(peak_enc, enc_meter.bytes)
    static_all = param_bytes(list(model.parts())) + sum(optimizer_state_bytes(o) for o in optimizers)
    static_enc = param_bytes(model.blocks) + optimizer_state_bytes(optimizers[1])
    return statistics.median(times), static_all + peak_all, static_enc + peak_enc


class PlainTrainer:
    """The whole model in this process, one optimizer per part (element-wise, so the same as one). Its token
    embedding takes row-sparse gradients, densified before the update, as the CU's does
    (``pipeline/sparse_embedding.py``), so the framework's overhead is not flattered by an optimisation the
    reference lacks."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.model = make_model().train()
        use_sparse_gradients(self.model.embedding)
        self.optimizers = [SPEC.build(part.parameters()) for part in self.model.parts()]

    def step(self, batch) -> float:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss_sum, count = self.model.loss_terms(batch)
        (loss_sum / count).backward()
        densify_gradients(self.model.embedding)
        for opt in self.optimizers:
            opt.step()
        seconds = time.perf_counter() - start
        torch.set_num_threads(previous)
        return seconds


def pipeline_figures(
    batch,
    S: int,
    ms,
    warmup: int,
    steps: int,
    threads: int | None,
    plain: PlainTrainer,
    pin: str = "false",
    handoff: str = "auto",
):
    """Per m: (median pipelined step s, median plain step s measured in alternation with it), and the
    largest per-device peak bytes. Alternating the two keeps the ratio fair when other jobs load the CPU."""
    model = make_model()
    head = LocalHead(model.head, SPEC)
    medians = {}
    with ClusterPipeline(
        model.embedding,
        model.blocks,
        DELTAS[S],
        SPEC,
        runtime=ClusterRuntime(
            RuntimeSpec(backend="ray", precision="fp32", pin_threads=pin, handoff=handoff), actor_threads=threads
        ),
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


class CpuMeter:
    """CPU seconds (user + system) spent by this process (the CU), by given groups of actor processes and by the
    rest of this process's descendants (Ray's raylet, GCS, idle workers), over the calls between :meth:`start` and
    :meth:`stop`: where a step's core time goes, beside its wall time. Read from psutil's per-process counters, so
    the figures hold whatever else the machine runs."""

    def __init__(self, groups: dict[str, set[int]]) -> None:
        self.groups = groups
        self.totals: dict[str, list[float]] = {name: [] for name in ["cu", *groups, "ray_system"]}
        self._before: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        import psutil

        me = psutil.Process()
        seconds = dict.fromkeys(self.totals, 0.0)
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:  # a worker that ended meanwhile
                continue
            group = "cu" if proc.pid == me.pid else "ray_system"
            group = next((name for name, pids in self.groups.items() if proc.pid in pids), group)
            seconds[group] += times.user + times.system
        return seconds

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> None:
        after = self._read()
        for name in self.totals:
            self.totals[name].append(after[name] - self._before[name])

    def medians(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_cpu_{name}_s": statistics.median(values) for name, values in self.totals.items()}


def step_bound(traces: list[list[tuple[str, int, float, float]]], timings, s1_compute_s: float) -> dict[str, float]:
    """One pipelined step against what its own compute allows (issue 48: where the time between stages goes).

    From the devices' traces of the step (``ClusterPipeline.traces``: each call's wall start and end), each forward's
    and backward's seconds per (micro-batch i, stage k) give the GPipe critical path with hand-overs that take no
    time (``schedule.gpipe_critical_path_s``); ``bound_s`` adds the CU's own embed, head and update phases. Then
    ``over_bound`` = the measured step / bound_s: what the hand-overs, Ray's calls and the CU's work outside those
    phases cost (1 = none). ``microbatch_inflation`` = the S devices' compute this step / ``s1_compute_s`` (the
    whole batch through every block on one device, S = 1, m = 1): what the m micro-batches cost in compute together
    with the devices sharing the cores with the CU and Ray in the step (GPipe's bound (m + S - 1) / (S m) assumes 1;
    docs/benchmarks.md measures the two apart)."""
    m = 1 + max(i for calls in traces for _, i, _, _ in calls)
    forward = [[0.0] * len(traces) for _ in range(m)]
    backward = [[0.0] * len(traces) for _ in range(m)]
    for k, calls in enumerate(traces):
        for kind, i, start, end in calls:
            (forward if kind == "F" else backward)[i][k] += end - start
    critical = gpipe_critical_path_s(forward, backward)
    bound = critical + timings.embed + timings.head + timings.update
    compute = sum(map(sum, forward)) + sum(map(sum, backward))
    return {
        "critical_path_s": critical,
        "bound_s": bound,
        "over_bound": timings.total / bound,
        "microbatch_inflation": compute / s1_compute_s,
    }


def fair_figures(batch, warmup: int, steps: int, pin: str, handoff: str = "auto") -> dict[str, float]:
    """Issue 30's fair pipeline figures (module docstring): every device actor gets one core (``pin``) and one torch
    thread, the CU (embedding, head, driver) one thread, the plain model one thread. The trainers' steps
    alternate, so they see the same background load; medians of ``steps`` steps after ``warmup``. With a
    ``handoff`` other than ``object_store`` (runtime.handoff), S = 2, m = 4 also runs through Ray's object store
    in the same alternation (``fair_step_s_S2_m4_object_store``): the hand-over's gain measured within one run."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    plain = PlainTrainer(1)

    def runtime(mode: str) -> ClusterRuntime:
        spec = RuntimeSpec(backend="ray", precision="fp32", pin_threads=pin, handoff=mode)
        return ClusterRuntime(spec, actor_threads=1)

    compare = handoff != "object_store"
    times: dict[str, list[float]] = {"plain": [], "S1_m1": [], "S2_m4": [], "S2_m4_object_store": []}
    phases: dict[str, list[dict[str, float]]] = {"S1_m1": [], "S2_m4": []}  # the CU's view of each step (a profile)
    bounds: list[dict[str, float]] = []  # S = 2, m = 4 against its compute-bound critical path (step_bound)
    one, two = make_model(), make_model()
    head_one, head_two = LocalHead(one.head, SPEC), LocalHead(two.head, SPEC)
    with contextlib.ExitStack() as stack:
        pipe_one = stack.enter_context(
            ClusterPipeline(one.embedding, one.blocks, DELTAS[1], SPEC, runtime=runtime(handoff))
        )
        pipe_two = stack.enter_context(
            ClusterPipeline(two.embedding, two.blocks, DELTAS[2], SPEC, runtime=runtime(handoff))
        )
        # The object-store pipeline exists only when it is compared: idle, its actors would still hold processes.
        if compare:
            three = make_model()
            head_three = LocalHead(three.head, SPEC)
            pipe_three = stack.enter_context(
                ClusterPipeline(three.embedding, three.blocks, DELTAS[2], SPEC, runtime=runtime("object_store"))
            )
        print(f"handoff: {pipe_two._stages.handoff}")
        pipes = {"S1": pipe_one, "S2": pipe_two, **({"S2_object_store": pipe_three} if compare else {})}
        pids = {name: {p.pid for p in pipe._stages.processes().values()} for name, pipe in pipes.items()}
        every_actor = set().union(*pids.values())
        meters = {
            key: CpuMeter({"devices": pids[key[:2]], "idle_actors": every_actor - pids[key[:2]]})
            for key in ("S1_m1", "S2_m4")
        }
        for i in range(warmup + steps):
            plain_s = plain.step(batch)
            meters["S1_m1"].start()
            one_t = pipe_one.train_step(batch, 1, head_one).timings
            meters["S1_m1"].stop()
            meters["S2_m4"].start()
            two_t = pipe_two.train_step(batch, 4, head_two).timings
            meters["S2_m4"].stop()
            three_s = pipe_three.train_step(batch, 4, head_three).timings.total if compare else 0.0
            if i >= warmup:
                for key, value in (("plain", plain_s), ("S1_m1", one_t.total), ("S2_m4", two_t.total)):
                    times[key].append(value)
                times["S2_m4_object_store"].append(three_s)
                for key, t in (("S1_m1", one_t), ("S2_m4", two_t)):
                    busy = {f"device{k}_compute": c for k, c in t.device_compute.items()}
                    phases[key].append({**t.phases(), **busy})
                bounds.append(step_bound(pipe_two.traces(), two_t, sum(one_t.device_compute.values())))
    torch.set_num_threads(previous)
    median = {key: statistics.median(values) for key, values in times.items()}
    profile = {
        f"fair_{key}_{name}_s": statistics.median(step[name] for step in steps)
        for key, steps in phases.items()
        for name in steps[0]
    }
    for meter in meters.values():  # the warm-up steps out
        meter.totals = {name: values[warmup:] for name, values in meter.totals.items()}
    cpu = {name: value for key, meter in meters.items() for name, value in meter.medians(f"fair_{key}").items()}
    bound = {f"fair_S2_m4_{name}": statistics.median(b[name] for b in bounds) for name in bounds[0]}
    return {
        **profile,
        **cpu,
        **bound,
        "device_speedup_S2_m4_bound": bound["fair_S2_m4_bound_s"] / median["S1_m1"],
        "fair_plain_step_s_threads1": median["plain"],
        "fair_step_s_S1_m1": median["S1_m1"],
        "fair_step_s_S2_m4": median["S2_m4"],
        "overhead_ratio_equal_cores": median["S1_m1"] / median["plain"],
        "device_speedup_S2_m4": median["S2_m4"] / median["S1_m1"],
        # the same two ratios step by step (each iteration's steps ran seconds apart), then their median: a machine
        # whose speed drifts over minutes moves these less than a ratio of medians
        "overhead_ratio_equal_cores_paired": statistics.median(
            one / plain for one, plain in zip(times["S1_m1"], times["plain"], strict=True)
        ),
        "device_speedup_S2_m4_paired": statistics.median(
            two / one for two, one in zip(times["S2_m4"], times["S1_m1"], strict=True)
        ),
        **(
            {
                "fair_step_s_S2_m4_object_store": median["S2_m4_object_store"],
                "device_speedup_S2_m4_object_store": median["S2_m4_object_store"] / median["S1_m1"],
            }
            if compare
            else {}
        ),
    }


def gpipe_limit_S2(m: int, pair_slowdown: float) -> float:
    """S = 2's GPipe step over S = 1, m = 1's when every call of the two stages takes the same time alone and
    ``pair_slowdown`` (c) times as long while the other stage computes too: each pass has one slot with stage 0
    alone, m - 1 with both, one with stage 1 alone, so (2 + (m - 1) c) / (2 m); c = 1 gives GPipe's (m + 1) / (2 m)
    (0.625 at m = 4)."""
    return (2 + (m - 1) * pair_slowdown) / (2 * m)


def _pair_worker(conn, core: int, rows: int, seq_len: int, blocks: int, m: int) -> None:
    """One device's work of a GPipe step in a process of its own on ``core``: ``blocks`` TEBs of the benchmark's
    model, m forwards on ``rows`` x ``seq_len`` micro-batches, then their m backwards in reverse order (the stage's
    order, so all m micro-batches' activations are held at once), one torch thread; answers each count n it receives
    with the seconds n such steps took, until it receives None."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    segment = make_model().blocks[:blocks]
    inputs = [torch.randn(rows, seq_len, HIDDEN) for _ in range(m)]
    mask = torch.ones(rows, seq_len, dtype=torch.long)

    def step() -> None:
        outputs = []
        for x in inputs:
            hidden = x.detach().requires_grad_(True)
            for block in segment:
                hidden = block(hidden, mask)
            outputs.append(hidden)
        for hidden in reversed(outputs):
            hidden.sum().backward()
        for p in segment.parameters():
            p.grad = None

    while (n := conn.recv()) is not None:
        start = time.perf_counter()
        for _ in range(n):
            step()
        conn.send(time.perf_counter() - start)


def pair_figures(rows: int, seq_len: int, blocks: int, m: int = 4, rounds: int = 5, steps: int = 2) -> dict[str, float]:
    """What this machine gives two devices that compute at once (the S = 2 figures' premise: one core each, as
    fast as one alone). Two processes, each pinned to its own core with one torch thread, run one device's work of
    a GPipe step of S = 2 (``_pair_worker``: its ``blocks`` blocks, m micro-batches of ``rows`` x ``seq_len``)
    ``steps`` times, first each alone, then both at once, ``rounds`` times in alternation;
    ``machine_pair_slowdown`` = median seconds at once / median seconds alone (1 on two independent cores; a VM
    whose two vCPUs share a physical core, a host that is busy, or two devices contending for memory bandwidth
    read more), and ``gpipe_limit_S2_m{m}_at_pair_slowdown`` is GPipe's S = 2 limit with that slowdown
    (:func:`gpipe_limit_S2`; modelled from the measured c). Empty on a host with fewer than two usable cores."""
    import multiprocessing

    cores = usable_cores_list()[:2]
    if len(cores) < 2:
        return {}
    ctx = multiprocessing.get_context("spawn")
    conns, procs = [], []
    alone: list[float] = []
    together: list[float] = []

    def answer(conn) -> float:
        if not conn.poll(600):
            raise RuntimeError("a pair-figure worker gave no answer in 600 s")
        return conn.recv()

    try:
        for core in cores:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pair_worker, args=(child, core, rows, seq_len, blocks, m), daemon=True)
            proc.start()
            conns.append(parent)
            procs.append(proc)
        for conn in conns:  # warm-up, one at a time
            conn.send(1)
            answer(conn)
        for _ in range(rounds):
            for conn in conns:
                conn.send(steps)
                alone.append(answer(conn))
            for conn in conns:
                conn.send(steps)
            together.extend(answer(conn) for conn in conns)
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    slowdown = statistics.median(together) / statistics.median(alone)
    return {
        "machine_alone_s": statistics.median(alone) / steps,
        "machine_pair_s": statistics.median(together) / steps,
        "machine_pair_slowdown": slowdown,
        f"gpipe_limit_S2_m{m}_at_pair_slowdown": gpipe_limit_S2(m, slowdown),
    }


def quota_figures(batch, warmup: int, steps: int, device_cores: float, pin: str, handoff: str) -> dict[str, float]:
    """The device speed-up with every device an emulated one of ``device_cores`` cores (the testbed's cgroup CPU
    quota, ``set_testbed``), so that S = 2 devices leave the CU and Ray a share of their own, as a CU's own box
    would: S = 2, m = 4 over S = 1, m = 1, each device actor pinned to its own core under the same quota, the two
    pipelines' steps alternating. ``fair_figures``' one-core figure cannot give the CU that share on a 2-core host
    (its profile: the devices' 0.97 core-seconds, the CU's 0.08 and Ray's 0.055 share the two cores). Raises
    TestbedError (one line) where cgroup quotas cannot be used."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = RuntimeSpec(backend="ray", precision="fp32", pin_threads=pin, handoff=handoff)
    one, two = make_model(), make_model()
    head_one, head_two = LocalHead(one.head, SPEC), LocalHead(two.head, SPEC)
    times: dict[str, list[float]] = {"S1_m1": [], "S2_m4": []}
    granted: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        pipes = {}
        for key, S in (("S1_m1", 1), ("S2_m4", 2)):
            model = one if S == 1 else two
            pipe = stack.enter_context(
                ClusterPipeline(
                    model.embedding, model.blocks, DELTAS[S], SPEC, runtime=ClusterRuntime(spec, actor_threads=1)
                )
            )
            stack.callback(pipe.clear_testbed)  # the cgroups go before the actors do
            emulation = DeviceEmulation((device_cores,) * S, (0.0,) * S, (0.0,) * S)
            cores = pipe.set_testbed(emulation, f"collapipe-bench-{key}-")
            granted.update({f"quota_{key}_device{k}_cores": c for k, c in cores.items()})
            pipes[key] = pipe
        for i in range(warmup + steps):
            for key, head, m in (("S1_m1", head_one, 1), ("S2_m4", head_two, 4)):
                seconds = pipes[key].train_step(batch, m, head).timings.total
                if i >= warmup:
                    times[key].append(seconds)
    torch.set_num_threads(previous)
    median = {key: statistics.median(values) for key, values in times.items()}
    return {
        **granted,
        "quota_device_cores": device_cores,
        "quota_step_s_S1_m1": median["S1_m1"],
        "quota_step_s_S2_m4": median["S2_m4"],
        "device_speedup_S2_m4_quota": median["S2_m4"] / median["S1_m1"],
    }


def main() -> None:
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
    parser.add_argument("--no-fair", dest="fair", action="store_false", help="skip the two fair figures")
    parser.add_argument("--fair-only", action="store_true", help="only the two fair figures")
    parser.add_argument(
        "--actor-threads",
        type=int,
        default=None,
        help="torch threads per device actor (default max(1, (cores - 1) // S))",
    )
    args = parser.parse_args()

    import ray

    cores = usable_cores()
    torch.set_num_threads(cores)
    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    batch = make_batch(args.batch, args.seq_len)
    print(f"cores: {cores}")
    print(f"pin_threads: {args.pin}")
    print(f"load_avg_1min: {os.getloadavg()[0]:.2f}")
    if args.fair or args.fair_only:
        fair_pin = "true" if args.pin == "false" else args.pin  # one core per device actor
        for name, value in fair_figures(batch, args.warmup, args.steps, fair_pin, args.handoff).items():
            print(f"{name}: {value:.4f}")
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
        if args.fair_only:
            print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")
            ray.shutdown()
            return
    plain_1, _, _ = plain_model_figures(batch, args.warmup, args.steps, threads=1)
    plain_n, plain_peak, plain_enc_peak = plain_model_figures(batch, args.warmup, args.steps, threads=cores)
    torch.set_num_threads(cores)
    plain_threads = 1 if plain_1 <= plain_n else cores
    print(f"plain_step_s_threads1: {plain_1:.4f}")
    print(f"plain_step_s_threads{cores}: {plain_n:.4f}")
    print(f"plain_threads: {plain_threads}")
    print(f"plain_peak_bytes: {plain_peak}")
    plain = PlainTrainer(plain_threads)
    all_plain = []
    for S in args.segments:
        sets = core_sets(usable_cores_list(), S, args.pin)
        threads = args.actor_threads or (len(sets[0]) if sets else default_actor_threads(S))
        medians, peak = pipeline_figures(
            batch, S, args.micro_batches, args.warmup, args.steps, args.actor_threads, plain, args.pin, args.handoff
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
    print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
