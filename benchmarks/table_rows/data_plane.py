"""The data plane's rows (``data_plane.py``): one exchange on each transport and encoding."""

from __future__ import annotations

from pathlib import Path

import yaml

from table_rows.row import Row, figure_named

CONF = Path(__file__).resolve().parent.parent.parent / "conf" / "config.yaml"


def default_transport() -> str:
    """``dataplane.transport`` as conf/config.yaml sets it (tests/test_config.py ties it to the
    code's default), read without importing the data plane package (torch, grpc: seconds at the driver's start)."""
    conf = yaml.safe_load(CONF.read_text(encoding="utf-8"))
    return str(conf["dataplane"]["transport"])


def data_plane_rows(dp_args: str) -> list[Row]:
    """One 64 x 32 x 256 exchange over the data plane on the transport a run gets by default
    (``dataplane.transport``'s default; both transports shown): fp32 inline <= 1.5 ms, through shared memory
    <= 0.6 ms (issue 48), int8 <= 3 ms; each channel alone (less the host's head step, reported apart) <= 3 ms
    inline and <= 2 ms through shared memory; then against a plain BERT-small step."""
    command = f"python benchmarks/data_plane.py {dp_args}"
    default = f"default transport ({default_transport()})"
    return [
        *(Row(figure, figure_named(name), "ms", target, command) for figure, name, target in _exchanges(default)),
        Row(
            f"data plane int8 exchange ({default}) / plain BERT-small step (32 x 64)",
            lambda f: f["data_plane_int8_default_ms_median"] / (1000 * f["plain_step_s"]),
            "",
            0.05,
            "both of the above",
        ),
        Row(
            f"data plane fp32 inline exchange ({default}) / plain BERT-small step (32 x 64)",
            lambda f: f["data_plane_inline_default_ms_median"] / (1000 * f["plain_step_s"]),
            "",
            0.05,
            "both of the above",
        ),
    ]


def _exchanges(default: str) -> list[tuple[str, str, float | None]]:
    """(the figure, its printed name, its target in ms or None) of every exchange, ``default`` naming the default
    transport."""
    return [  # (figure, printed name, target ms)
        (f"data plane fp32 inline, one 64 x 32 x 256 exchange, {default}", "data_plane_inline_default_ms_median", 1.5),
        ("data plane fp32 inline exchange, dataplane.transport=grpc", "data_plane_ms_median", None),
        ("data plane fp32 inline exchange, dataplane.transport=socket", "data_plane_socket_ms_median", None),
        ("data plane, the same exchange with fp16 on the wire (grpc)", "data_plane_fp16_ms_median", None),
        (
            f"data plane, the same exchange with int8 (per-channel) on the wire, {default}",
            "data_plane_int8_default_ms_median",
            3.0,
        ),
        ("data plane int8 exchange, dataplane.transport=grpc", "data_plane_int8_ms_median", None),
        ("data plane int8 exchange, dataplane.transport=socket", "data_plane_socket_int8_ms_median", None),
        (
            f"data plane fp32 inline less the host's head step (the channel alone), {default}",
            "data_plane_inline_default_channel_ms",
            3.0,
        ),
        ("data plane fp32 inline channel alone, dataplane.transport=grpc", "data_plane_channel_ms", None),
        ("data plane fp32 inline channel alone, dataplane.transport=socket", "data_plane_socket_channel_ms", None),
        (
            f"data plane, the host's head step within the fp32 inline exchange (trivial head, {default})",
            "data_plane_inline_default_head_ms",
            None,
        ),
        (
            f"data plane, the fp32 exchange through shared memory (CU on the server's host), {default}",
            "data_plane_shm_default_ms_median",
            0.6,
        ),
        ("data plane shared-memory exchange, pointer frames over grpc", "data_plane_shm_ms_median", None),
        ("data plane shared-memory exchange, pointer frames over socket", "data_plane_socket_shm_ms_median", None),
        (
            f"data plane shared-memory exchange less the host's head step (the channel alone), {default}",
            "data_plane_shm_default_channel_ms",
            2.0,
        ),
    ]
