"""The data plane's rows (``data_plane.py``): one exchange on each transport and encoding."""

from __future__ import annotations

from pathlib import Path

import yaml

from table_rows.row import Row, figure_named

CONF = Path(__file__).resolve().parent.parent.parent / "conf" / "config.yaml"


def default_transport() -> str:
    """``dataplane.transport`` as conf/config.yaml sets it (tests/config/test_config.py ties it to the
    code's default), read without importing the data plane package (torch, grpc: seconds at the driver's start)."""
    conf = yaml.safe_load(CONF.read_text(encoding="utf-8"))
    return str(conf["dataplane"]["transport"])


def data_plane_rows(dp_args: str) -> list[Row]:
    """The data plane's targets are ratios (issue 64), both sides timed alternately in one run: the fp32 exchange
    on the transport a run gets by default (``dataplane.transport``'s default) over the same head step in one
    process, <= 1.5x inline and <= 1.2x through shared memory. Every exchange's milliseconds follow as context (the
    absolute targets of issue 48 were set on one machine and cannot judge another); then against a plain
    BERT-small step."""
    command = f"python benchmarks/data_plane.py {dp_args}"
    default = f"default transport ({default_transport()})"
    return [
        Row(
            f"data plane fp32 inline exchange ({default}) / the same head step in one process, paired",
            figure_named("data_plane_inline_over_in_process"),
            "x",
            1.5,
            command,
        ),
        Row(
            f"data plane fp32 exchange through shared memory ({default}) / the same head step in one process, paired",
            figure_named("data_plane_shm_over_in_process"),
            "x",
            1.2,
            command,
        ),
        *(Row(figure, figure_named(name), "ms", None, command) for figure, name in _exchanges(default)),
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


def _exchanges(default: str) -> list[tuple[str, str]]:
    """(the figure, its printed name) of every exchange, in ms, ``default`` naming the default transport."""
    return [  # (figure, printed name)
        (f"data plane fp32 inline, one 64 x 32 x 256 exchange, {default}", "data_plane_inline_default_ms_median"),
        ("data plane fp32 inline exchange, dataplane.transport=grpc", "data_plane_ms_median"),
        ("data plane fp32 inline exchange, dataplane.transport=socket", "data_plane_socket_ms_median"),
        ("data plane, the same exchange with fp16 on the wire (grpc)", "data_plane_fp16_ms_median"),
        (
            f"data plane, the same exchange with int8 (per-channel) on the wire, {default}",
            "data_plane_int8_default_ms_median",
        ),
        ("data plane int8 exchange, dataplane.transport=grpc", "data_plane_int8_ms_median"),
        ("data plane int8 exchange, dataplane.transport=socket", "data_plane_socket_int8_ms_median"),
        (
            f"data plane fp32 inline less the host's head step (the channel alone), {default}",
            "data_plane_inline_default_channel_ms",
        ),
        ("data plane fp32 inline channel alone, dataplane.transport=grpc", "data_plane_channel_ms"),
        ("data plane fp32 inline channel alone, dataplane.transport=socket", "data_plane_socket_channel_ms"),
        (
            f"data plane, the host's head step within the fp32 inline exchange (trivial head, {default})",
            "data_plane_inline_default_head_ms",
        ),
        (
            f"data plane, the fp32 exchange through shared memory (CU on the server's host), {default}",
            "data_plane_shm_default_ms_median",
        ),
        ("data plane shared-memory exchange, pointer frames over grpc", "data_plane_shm_ms_median"),
        ("data plane shared-memory exchange, pointer frames over socket", "data_plane_socket_shm_ms_median"),
        (
            f"data plane shared-memory exchange less the host's head step (the channel alone), {default}",
            "data_plane_shm_default_channel_ms",
        ),
    ]
