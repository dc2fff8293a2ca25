"""A run's own figures: PNGs in ``<run>/plots/`` drawn from its rounds.jsonl, and optional TensorBoard scalars.

:func:`write_run_plots` reads ``<run>/rounds.jsonl`` (a line torn by a crash is skipped, as
:func:`~collapipe_flwr.fl.records.run_log.read_rounds` does) and writes, one figure per file, x axis the round t:

- ``plots/loss.png``: training loss per round, the record's ``train_loss`` (example-weighted over the CUs
  that returned a result) and, thinner, each CU's ``clients.<n>.train-loss``.
- ``plots/metric.png``: validation per evaluated round (round 0 = before training): the task metric
  ``val_<metric>`` (bleu | f1 | accuracy, as the evaluator named it; or the ``metric`` argument) and, in a
  second panel, ``val_loss``.
- ``plots/delay.png``: top, the modelled round delay tau(t) (eq. 26) as bars stacked into computation /
  D2D / uplink, the bottleneck CU's ``modelled.clusters[n].compute_s``, ``d2d_s``, ``uplink_s``
  (:func:`~collapipe_flwr.fl.records.round_values.round_delay_split`), with ``modelled.round_delay_s`` as a line;
  bottom, the measured wall-clock ``measured_s.round_s`` of the round and ``measured_s.wait_clients_s``
  (time waiting for the CUs).
- ``plots/memory.png``: per-device peak memory (MiB), ``clients.<n>.device-peak-bytes[k]``, a line per
  (CU n, device k); 0 means the plan left the device idle that round and draws no point.
- ``plots/partitions.png``: each cluster's D_n as its examples per label, stacked (``partitions`` of the last
  record; task.partition decides how skewed they are).

A figure whose data no record holds (no evaluated round, no modelled delay, no memory report) is skipped,
not drawn empty. The figures are :class:`matplotlib.figure.Figure` objects on an Agg canvas (no pyplot, so
no global figure registry or backend switch; a figure is freed once saved), 100 dpi PNGs replaced
atomically. The shared helpers :func:`new_figure`, :func:`round_axis` and :func:`save_figure` also draw the
sweep report's figures (collapipe_flwr/experiments/figures.py).

TensorBoard (optional, ``pip install tensorboard``): :func:`round_scalars` maps a record to the same values
as ``{tag: float}``; :class:`TensorBoardLog` writes them per round with ``torch.utils.tensorboard``;
:func:`write_tensorboard` replays a finished run's rounds.jsonl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from collapipe_flwr.atomic_files import replace_atomically
from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.records.round_values import METRICS, VAL_COMPANIONS, number, round_delay_split, round_energy
from collapipe_flwr.fl.records.run_log import read_rounds

PLOTS_SUBDIR = "plots"
DPI = 100
MIB = 1024.0 * 1024.0
MAX_LEGEND = 16  # more lines than this: no legend (it would cover the panel)
PHASES = (("compute", "computation"), ("d2d", "D2D"), ("uplink", "uplink"))


# --------------------------------------------------------------------------- shared drawing helpers
def new_figure(rows: int, cols: int = 1) -> tuple[Figure, Any]:
    """A figure on an Agg canvas with a ``rows x cols`` array of panels (always 2-D)."""
    fig = Figure(figsize=(6.4 * cols, 3.6 * rows))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def round_axis(ax) -> None:
    """x axis = the round t, integer ticks."""
    ax.set_xlabel("round t")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    """Lay out and write ``fig`` as a PNG at ``path`` (folder created, file replaced atomically)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CollaPipeError(f"cannot create {path.parent}: {err.strerror or type(err).__name__}") from None
    fig.tight_layout()
    replace_atomically(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
    fig.clear()
    return path


def _legend(ax, lines: int) -> None:
    if 0 < lines <= MAX_LEGEND:
        ax.legend(fontsize=7, ncol=1 if lines <= 6 else 2)


def _points(rounds: Sequence[int], values: Sequence[float | None]) -> tuple[list[int], list[float]]:
    kept = [(t, v) for t, v in zip(rounds, values) if v is not None]
    return [t for t, _ in kept], [v for _, v in kept]


# --------------------------------------------------------------------------- reading the records
def load_rounds(run_dir: str | Path) -> list[dict]:
    """The run's round records in round order (torn lines and records without a round number skipped)."""
    records = [r for r in read_rounds(run_dir) if isinstance(r, dict) and number(r.get("round")) is not None]
    return sorted(records, key=lambda r: int(r["round"]))


def _metric_of(records: Sequence[Mapping], metric: str | None) -> str | None:
    if metric:
        return metric
    keys = [k[4:] for r in records for k in r if k.startswith("val_") and k[4:] not in VAL_COMPANIONS]
    known = [k for k in METRICS if k in keys]
    return known[0] if known else (keys[0] if keys else None)


def _clients(record: Mapping) -> dict[str, Mapping]:
    clients = record.get("clients") or {}
    return {str(n): c for n, c in clients.items() if isinstance(c, Mapping)} if isinstance(clients, Mapping) else {}


def _cu_order(names) -> list[str]:
    return sorted(names, key=lambda n: (0, int(n), n) if str(n).isdigit() else (1, 0, str(n)))


def _device_peaks(record: Mapping) -> dict[tuple[str, int], float]:
    """{(CU, device k): peak MiB} of the devices that held blocks this round (peak > 0)."""
    out: dict[tuple[str, int], float] = {}
    for n, client in _clients(record).items():
        peaks = client.get("device-peak-bytes")
        for k, value in enumerate(peaks if isinstance(peaks, list) else []):
            v = number(value)
            if v is not None and v > 0:
                out[(n, k)] = v / MIB
    return out


# --------------------------------------------------------------------------- the figures
def _loss_figure(records: Sequence[Mapping], path: Path) -> Path | None:
    rounds = [int(r["round"]) for r in records]
    total = [number(r.get("train_loss")) for r in records]
    cus = _cu_order({n for r in records for n in _clients(r)})
    per_cu = {n: [number(_clients(r).get(n, {}).get("train-loss")) for r in records] for n in cus}
    if not any(v is not None for v in total) and not any(v is not None for s in per_cu.values() for v in s):
        return None
    fig, axes = new_figure(1)
    ax = axes[0, 0]
    lines = 0
    if len(cus) <= MAX_LEGEND:
        for n in cus:
            xs, ys = _points(rounds, per_cu[n])
            if xs:
                ax.plot(xs, ys, linewidth=0.8, alpha=0.7, marker=".", markersize=3, label=f"CU {n}")
                lines += 1
    xs, ys = _points(rounds, total)
    if xs:
        ax.plot(xs, ys, color="black", linewidth=2, marker="o", markersize=4, label="all CUs (example-weighted)")
        lines += 1
    _legend(ax, lines)
    round_axis(ax)
    ax.set_ylabel("train loss")
    ax.set_title("training loss per round")
    return save_figure(fig, path)


def _metric_figure(records: Sequence[Mapping], metric: str | None, path: Path) -> Path | None:
    rounds = [int(r["round"]) for r in records]
    panels = []
    if metric:
        values = [number(r.get(f"val_{metric}")) for r in records]
        if any(v is not None for v in values):
            panels.append((metric, values))
    losses = [number(r.get("val_loss")) for r in records]
    if any(v is not None for v in losses):
        panels.append(("loss", losses))
    if not panels:
        return None
    fig, axes = new_figure(len(panels))
    for ax, (name, values) in zip(axes[:, 0], panels):
        xs, ys = _points(rounds, values)
        ax.plot(xs, ys, marker="o", markersize=4)
        round_axis(ax)
        ax.set_ylabel(f"validation {name}")
        ax.set_title(f"validation {name} per evaluated round")
    return save_figure(fig, path)


def _delay_figure(records: Sequence[Mapping], path: Path) -> Path | None:
    trained = [r for r in records if int(r["round"]) >= 1]
    rounds = [int(r["round"]) for r in trained]
    splits = [round_delay_split(r) or {} for r in trained]
    measured = {
        key: [number((r.get("measured_s") or {}).get(key)) for r in trained] for key in ("round_s", "wait_clients_s")
    }
    modelled = any(s.get("delay") is not None for s in splits)
    wall = any(v is not None for v in measured["round_s"] + measured["wait_clients_s"])
    if not (modelled or wall):
        return None
    fig, axes = new_figure(int(modelled) + int(wall))
    panels = iter(axes[:, 0])
    if modelled:
        ax = next(panels)
        split_rounds = [(t, s) for t, s in zip(rounds, splits) if all(s.get(k) is not None for k, _ in PHASES)]
        bottom = [0.0] * len(split_rounds)
        for key, label in PHASES:
            heights = [float(s[key]) for _, s in split_rounds]
            if split_rounds:
                ax.bar([t for t, _ in split_rounds], heights, width=0.8, bottom=bottom, label=label)
            bottom = [b + h for b, h in zip(bottom, heights)]
        xs, ys = _points(rounds, [s.get("delay") for s in splits])
        ax.plot(xs, ys, color="black", marker="o", markersize=3, linewidth=1, label="round delay tau(t)")
        ax.legend(fontsize=7)
        round_axis(ax)
        ax.set_ylabel("seconds (modelled)")
        ax.set_title("modelled round delay, bottleneck CU's split")
    if wall:
        ax = next(panels)
        for key, label in (("round_s", "round wall-clock"), ("wait_clients_s", "waiting for the CUs")):
            xs, ys = _points(rounds, measured[key])
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.legend(fontsize=7)
        round_axis(ax)
        ax.set_ylabel("seconds (measured)")
        ax.set_title("measured round time")
    return save_figure(fig, path)


def _memory_figure(records: Sequence[Mapping], path: Path) -> Path | None:
    rounds = [int(r["round"]) for r in records]
    peaks = [_device_peaks(r) for r in records]
    found = {key for p in peaks for key in p}
    if not found:
        return None
    cus = _cu_order({n for n, _ in found})
    keys = sorted(found, key=lambda key: (cus.index(key[0]), key[1]))
    fig, axes = new_figure(1)
    ax = axes[0, 0]
    for n, k in keys:  # NaN where the device was idle: the line breaks there
        ys = [p.get((n, k), float("nan")) for p in peaks]
        ax.plot(rounds, ys, marker="o", markersize=3, linewidth=1, label=f"CU {n} device {k}")
    _legend(ax, len(keys))
    round_axis(ax)
    ax.set_ylim(0, 1.1 * max(v for p in peaks for v in p.values()))
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title("per-device peak memory" + ("" if len(keys) <= MAX_LEGEND else f" ({len(keys)} devices)"))
    return save_figure(fig, path)


def _partition_figure(records: Sequence[Mapping], path: Path) -> Path | None:
    """Each cluster's D_n: its examples per label, stacked (task.partition: how skewed the split is)."""
    parts = records[-1].get("partitions") or {}
    if not parts:
        return None
    cus = _cu_order(parts)
    histograms = [list(parts[n].get("labels") or [parts[n].get("examples", 0)]) for n in cus]
    width = max(len(h) for h in histograms)
    fig, axes = new_figure(1)
    ax = axes[0, 0]
    bottom = [0] * len(cus)
    for label in range(width):
        counts = [h[label] if label < len(h) else 0 for h in histograms]
        ax.bar([f"CU {n}" for n in cus], counts, bottom=bottom, label=f"label {label}")
        bottom = [b + c for b, c in zip(bottom, counts)]
    _legend(ax, width)
    ax.set_ylabel("training examples")
    ax.set_title("partitions: examples per label and cluster")
    return save_figure(fig, path)


def write_run_plots(
    run_dir: Path, *, metric: str | None = None, records: Sequence[Mapping] | None = None
) -> list[Path]:
    """Draw the run's figures into ``<run_dir>/plots/`` (see the module docstring); returns the PNGs written.

    ``metric``: the task metric's name (``val_<metric>``); by default the one the records hold. A figure
    without data is skipped; a run folder without records gives ``[]``. ``records``: the run's rounds when
    the caller has read them already (else read from ``<run_dir>/rounds.jsonl``). An I/O error is a one-line
    :class:`~collapipe_flwr.errors.CollaPipeError`.
    """
    run_dir = Path(run_dir)
    records = load_rounds(run_dir) if records is None else records
    if not records:
        return []
    folder = run_dir / PLOTS_SUBDIR
    drawn = [
        _loss_figure(records, folder / "loss.png"),
        _metric_figure(records, _metric_of(records, metric), folder / "metric.png"),
        _delay_figure(records, folder / "delay.png"),
        _memory_figure(records, folder / "memory.png"),
        _partition_figure(records, folder / "partitions.png"),
    ]
    return [path for path in drawn if path is not None]


# --------------------------------------------------------------------------- TensorBoard
def round_scalars(record: Mapping) -> dict[str, float]:
    """The record's per-round values as TensorBoard ``{tag: value}`` (only those the record holds).

    train/loss (``train_loss``), train/loss/cu<n> (``clients.<n>.train-loss``), val/<name> (each
    ``val_<name>``), delay/{round,compute,d2d,uplink}_s (modelled, bottleneck CU's split), energy/{device,
    cu,total}_j (modelled, selected CUs), measured/<phase> (each ``measured_s`` entry),
    memory/cu<n>/device<k>_mib (``device-peak-bytes`` > 0, in MiB), failures (how many CUs failed).
    """
    out: dict[str, float] = {}

    def put(tag: str, value: Any) -> None:
        v = number(value)
        if v is not None:
            out[tag] = v

    put("train/loss", record.get("train_loss"))
    clients = _clients(record)
    for n in _cu_order(clients):
        put(f"train/loss/cu{n}", clients[n].get("train-loss"))
    for key in sorted(k for k in record if k.startswith("val_")):
        put(f"val/{key[4:]}", record[key])
    split = round_delay_split(record) or {}
    for key in ("delay", "compute", "d2d", "uplink"):
        put(f"delay/{'round' if key == 'delay' else key}_s", split.get(key))
    for key, value in (round_energy(record) or {}).items():
        put(f"energy/{key}_j", value)
    measured = record.get("measured_s")
    for key, value in sorted(measured.items() if isinstance(measured, Mapping) else []):
        put(f"measured/{key}", value)
    for (n, k), mib in sorted(_device_peaks(record).items()):
        put(f"memory/cu{n}/device{k}_mib", mib)
    if isinstance(record.get("failures"), list):
        put("failures", len(record["failures"]))
    return out


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "TensorBoard logging needs the tensorboard package, which is not installed: pip install tensorboard"
        ) from None
    return SummaryWriter


class TensorBoardLog:
    """Writes each round's :func:`round_scalars` to a TensorBoard event file in ``log_dir`` (step = round t).

    Raises :class:`~collapipe_flwr.errors.ConfigError` when the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        writer_class = _summary_writer_class()
        self.log_dir = Path(log_dir)
        self._writer = writer_class(log_dir=str(self.log_dir))

    def add_round(self, record: Mapping) -> None:
        step = int(record["round"])
        for tag, value in round_scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def write_tensorboard(run_dir: Path, log_dir: Path | None = None) -> Path:
    """Replay a run's rounds.jsonl into TensorBoard (default ``<run_dir>/tensorboard``); returns the folder."""
    run_dir = Path(run_dir)
    target = Path(log_dir) if log_dir is not None else run_dir / "tensorboard"
    with TensorBoardLog(target) as log:
        for record in load_rounds(run_dir):
            log.add_round(record)
    return target
