"""Per-step round trip of the decoder data plane vs the same exchange as Flower messages (issue 3).

Prints ``name: value`` lines:
- data_plane_ms_median / _p90: one step (a 64 x 32 x 256 float32 activation + attention mask up, the
  same-size float32 gradient down) through DecoderHost / DecoderClient on loopback, with a trivial head
  (one scalar weight) so the channel is what is measured; median over --steps steps after a warm-up.
- data_plane_fp16_ms_median: the same with float16 on the wire (scaled, see fl/dataplane/wire.py).
- data_plane_int8_ms_median: the same with int8 and per-channel scales on the wire (dataplane.compression).
- data_plane_shm_ms_median: the fp32 exchange through the same-host shortcut (dataplane.shared_memory: auto,
  fl/dataplane/shm.py): the frames through /dev/shm, only a pointer frame over gRPC;
  data_plane_socket_shm_ms_median: the same with the pointer frame over ``dataplane.transport: socket``;
  data_plane_shm_best_ms_median / _head_ms / _channel_ms / _transport: the faster of the two in this run
  (run_all's shared-memory rows); data_plane_int8_best_*: the same for the int8 exchange.
- data_plane_socket[_fp16|_int8]_ms_median: the same exchanges over ``dataplane.transport: socket`` (one TCP
  connection per CU, length-prefixed frames, fl/dataplane/socket_*.py) instead of gRPC streams.
- data_plane_inline_best_ms_median / _head_ms / _channel_ms / _transport: the fastest inline fp32 transport of
  this run; data_plane_socket_over_grpc: socket's median over gRPC's.
- data_plane_{inline,shm,int8}_default_*: the same for the transport a run gets by default
  (``dataplane.transport``'s default, ``fl/dataplane/backend.DEFAULT_TRANSPORT``): run_all's target rows.
- <prefix>_head_ms: of each exchange, the time the host spent in head_step (the trivial
  head's forward, backward and optimizer step), so exchange minus head (<prefix>_channel_ms) is the channel's own
  cost.
- data_plane_{inline,shm}_over_in_process: the default transport's fp32 exchange (inline; through shared memory)
  against the same head step run in one process (``pipeline.head.head_step``, what the host runs under its lock),
  timed alternately step by step: the median of the per-step ratios, with both medians
  (data_plane_*_paired_ms_median, data_plane_*_paired_in_process_ms_median). run_all's targets: <= 1.5x inline,
  <= 1.2x through shared memory (issue 64: ratios, so machines of different speeds can be judged).
- flower_message_ms_median: a ServerApp sends the activation in an ArrayRecord to a ClientApp in a Flower
  simulation (Ray backend, one SuperNode) and gets a same-size ArrayRecord back; median per round trip.

The modes run one after another in one process, so their ratios come from the same machine state.

Targets (benchmarks/run_all.py, issue 64): ratios, both sides timed in this run: the default transport's fp32
exchange over the same head step in one process, <= 1.5x inline and <= 1.2x through shared memory. The
milliseconds are context.

Also printed: process CPU ms per data-plane step (client and server together, so less sensitive to
other processes on a busy machine than wall time) and the 1-minute load average before and after.

Run: ``python benchmarks/data_plane.py`` (add ``--skip-flower`` for the data plane only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec  # noqa: E402
from collapipe_flwr.fl.dataplane.auth import cluster_key  # noqa: E402
from collapipe_flwr.fl.dataplane.backend import DEFAULT_TRANSPORT  # noqa: E402
from collapipe_flwr.fl.server.decoder.host import DecoderHost  # noqa: E402
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec  # noqa: E402
from collapipe_flwr.pipeline.head import head_step  # noqa: E402

B, T, H = 64, 32, 256


class TrivialHead(nn.Module):
    """loss = w * mean(hidden) per sample: negligible compute, a real backward to dL/dz_enc.

    The mean is written as a sum over a constant: the same loss, but ``mean``'s backward divides a broadcast
    (stride-0) gradient element by element, which cost 0.34 ms of a 2 MiB step's backward here against 0.15 ms for
    the sum's (measured with torch.profiler: ``aten::div`` under ``MeanBackward1``), time that belongs to no head
    and no channel."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def loss_terms(self, hidden, attention_mask, batch):
        per_sample = hidden.sum(dim=(1, 2)) / float(hidden.shape[1] * hidden.shape[2])
        return (per_sample * self.w).sum(), torch.tensor(hidden.shape[0])


def _summary(times_s: list[float]) -> tuple[float, float]:
    ms = sorted(t * 1e3 for t in times_s)
    return statistics.median(ms), ms[min(len(ms) - 1, int(0.9 * len(ms)))]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_data_plane(
    steps: int, compression: str, shared_memory: str = "off", transport: str = "grpc"
) -> tuple[float, float, int, float, float]:
    """(median ms, p90 ms, bytes per step both ways, process CPU ms per step: client + server, head ms per
    step on the host); ``shared_memory="auto"`` takes the same-host shortcut (frames through /dev/shm);
    ``transport``: grpc | socket (dataplane.transport)."""
    head = TrivialHead()
    host = DecoderHost(
        head,
        torch.optim.SGD(head.parameters(), lr=1e-3),
        "bench-secret",
        DecoderHostSpec(hidden_size=H, bind="127.0.0.1", compression=compression, transport=transport),
    )
    host.start()
    host.open_round(1, [0])
    z = [torch.randn(B, T, H)]
    mbs = [{"input_ids": torch.ones(B, T, dtype=torch.long), "attention_mask": torch.ones(B, T, dtype=torch.long)}]
    times = []
    try:
        spec = DecoderClientSpec(compression=compression, shared_memory=shared_memory, transport=transport)
        with DecoderClient(host.address, cluster_key("bench-secret", 1, 0), 1, 0, spec) as client:
            for _ in range(10):
                client(z, mbs)
            head0 = host.stats()["clusters"][0]["seconds_head"]
            cpu0 = _cpu_seconds()
            for _ in range(steps):
                t0 = time.perf_counter()
                _, grads = client(z, mbs)
                times.append(time.perf_counter() - t0)
            cpu_ms = (_cpu_seconds() - cpu0) * 1e3 / steps
            head_ms = (host.stats()["clusters"][0]["seconds_head"] - head0) * 1e3 / steps
            assert grads[0].shape == (B, T, H)
            bytes_per_step = (client.bytes_in + client.bytes_out) // client.steps
    finally:
        host.stop(grace_s=0)
    return (*_summary(times), bytes_per_step, cpu_ms, head_ms)


def _flower_apps(steps: int, out_file: str):
    from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    server_app, client_app = ServerApp(), ClientApp()

    @client_app.train()
    def echo(msg: Message, context: Context) -> Message:
        z = msg.content["z"].to_torch_state_dict()["z"]
        return Message(RecordDict({"grad": ArrayRecord(torch_state_dict={"grad": torch.ones_like(z)})}), reply_to=msg)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        node_ids: list[int] = []
        while not node_ids:
            node_ids = list(grid.get_node_ids())
            time.sleep(0.05)
        z = torch.randn(B, T, H)
        times = []
        for i in range(steps + 2):
            content = RecordDict({"z": ArrayRecord(torch_state_dict={"z": z})})
            t0 = time.perf_counter()
            replies = list(
                grid.send_and_receive([Message(content, dst_node_id=node_ids[0], message_type=MessageType.TRAIN)])
            )
            dt = time.perf_counter() - t0
            grad = replies[0].content["grad"].to_torch_state_dict()["grad"]
            assert grad.shape == z.shape
            if i >= 2:  # the first exchanges start the ClientApp
                times.append(dt)
        Path(out_file).write_text(json.dumps(times))

    return server_app, client_app


def bench_flower(steps: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
        os.environ["FLWR_HOME"] = str(Path(tmp) / "flwr-home")
        out_file = str(Path(tmp) / "times.json")
        from flwr.simulation import run_simulation

        server_app, client_app = _flower_apps(steps, out_file)
        run_simulation(
            server_app,
            client_app,
            num_supernodes=1,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": 1, "include_dashboard": False},
            },
        )
        return _summary(json.loads(Path(out_file).read_text()))


def bench_paired(steps: int, shared_memory: str, transport: str) -> tuple[float, float, float]:
    """The fp32 exchange against the same head step in one process, timed alternately step by step (issue 64):
    (median data-plane step ms, median in-process step ms, median of the per-step ratios). The in-process side is
    :func:`~collapipe_flwr.pipeline.head.head_step` on its own TrivialHead and SGD, the function the host runs
    under its lock, on the same activation and micro-batch: what the data plane adds is everything else."""
    head = TrivialHead()
    host = DecoderHost(
        head,
        torch.optim.SGD(head.parameters(), lr=1e-3),
        "bench-secret",
        DecoderHostSpec(hidden_size=H, bind="127.0.0.1", transport=transport),
    )
    local = TrivialHead()
    local_opt = torch.optim.SGD(local.parameters(), lr=1e-3)
    host.start()
    host.open_round(1, [0])
    z = [torch.randn(B, T, H)]
    mbs = [{"input_ids": torch.ones(B, T, dtype=torch.long), "attention_mask": torch.ones(B, T, dtype=torch.long)}]
    wire, alone = [], []
    try:
        spec = DecoderClientSpec(shared_memory=shared_memory, transport=transport)
        with DecoderClient(host.address, cluster_key("bench-secret", 1, 0), 1, 0, spec) as client:
            for _ in range(10):
                client(z, mbs)
                head_step(local, local_opt, z, mbs)
            for _ in range(steps):
                t0 = time.perf_counter()
                client(z, mbs)
                t1 = time.perf_counter()
                head_step(local, local_opt, z, mbs)
                wire.append(t1 - t0)
                alone.append(time.perf_counter() - t1)
    finally:
        host.stop(grace_s=0)
    ratios = [w / a for w, a in zip(wire, alone)]
    return _summary(wire)[0], _summary(alone)[0], statistics.median(ratios)


def print_paired(steps: int) -> None:
    """run_all's ratio rows: the default transport's fp32 exchange, inline and through shared memory, over the
    same head step in one process (targets <= 1.5x and <= 1.2x)."""
    for shared, kind in (("off", "inline"), ("auto", "shm")):
        wire_ms, alone_ms, ratio = bench_paired(steps, shared, DEFAULT_TRANSPORT)
        print(f"data_plane_{kind}_paired_ms_median: {wire_ms:.3f}")
        print(f"data_plane_{kind}_paired_in_process_ms_median: {alone_ms:.3f}")
        print(f"data_plane_{kind}_over_in_process: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="measured data-plane steps (default 200)")
    parser.add_argument("--flower-steps", type=int, default=30, help="measured Flower exchanges (~0.1 s each)")
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"activation_shape: {B}x{T}x{H} float32 ({B * T * H * 4 / 2**20:.1f} MiB)")
    print(f"cpu_count: {os.cpu_count()}")
    print(f"load_average_1min_before: {os.getloadavg()[0]:.2f}")
    median = 0.0
    modes = (
        ("none", "off", "grpc", "data_plane"),
        ("none", "off", "socket", "data_plane_socket"),
        ("fp16", "off", "grpc", "data_plane_fp16"),
        ("fp16", "off", "socket", "data_plane_socket_fp16"),
        ("int8", "off", "grpc", "data_plane_int8"),
        ("int8", "off", "socket", "data_plane_socket_int8"),
        ("none", "auto", "grpc", "data_plane_shm"),
        ("none", "auto", "socket", "data_plane_socket_shm"),
    )
    # transport -> (median ms, head ms): the fp32 inline exchange, the same through shared memory, int8 inline
    inline: dict[str, tuple[float, float]] = {}
    shared_mem: dict[str, tuple[float, float]] = {}
    int8: dict[str, tuple[float, float]] = {}
    for compression, shared, transport, prefix in modes:
        med, p90, nbytes, cpu_ms, head_ms = bench_data_plane(args.steps, compression, shared, transport)
        median = med if prefix == "data_plane" else median
        if compression == "none":
            (inline if shared == "off" else shared_mem)[transport] = (med, head_ms)
        elif compression == "int8":
            int8[transport] = (med, head_ms)
        print(f"{prefix}_ms_median: {med:.3f}")
        print(f"{prefix}_ms_p90: {p90:.3f}")
        print(f"{prefix}_head_ms: {head_ms:.3f}")
        print(f"{prefix}_channel_ms: {med - head_ms:.3f}")
        print(f"{prefix}_cpu_ms_per_step: {cpu_ms:.3f}")
        print(f"{prefix}_bytes_per_step: {nbytes}")
    for kind, found in (("inline", inline), ("shm", shared_mem), ("int8", int8)):
        best = min(found, key=lambda name: found[name][0])
        for which, transport in (("best", best), ("default", DEFAULT_TRANSPORT)):
            print(f"data_plane_{kind}_{which}_ms_median: {found[transport][0]:.3f}")
            print(f"data_plane_{kind}_{which}_head_ms: {found[transport][1]:.3f}")
            print(f"data_plane_{kind}_{which}_channel_ms: {found[transport][0] - found[transport][1]:.3f}")
            print(f"data_plane_{kind}_{which}_transport: {transport}")
    print(f"data_plane_socket_over_grpc: {inline['socket'][0] / inline['grpc'][0]:.3f}")
    print_paired(args.steps)
    print(f"data_plane_steps: {args.steps}")
    if not args.skip_flower:
        fmedian, fp90 = bench_flower(args.flower_steps)
        print(f"flower_message_ms_median: {fmedian:.3f}")
        print(f"flower_message_ms_p90: {fp90:.3f}")
        print(f"flower_message_steps: {args.flower_steps}")
        print(f"flower_over_data_plane: {fmedian / median:.1f}")
    print(f"load_average_1min_after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
