"""The ServerApp's body: compose + validate the config once, build the server state, run T rounds.

Run config keys (``[tool.flwr.app.config]``, overridable with ``flwr run . --run-config``):
- the flat keys of :data:`collapipe_flwr.config.flower_keys.FLAT_KEYS` (``num-server-rounds``, ``task``,
  ``model``, ``method``, ``scheduler``, ``num-clusters``, ``local-steps``, ``precision``, ``run-name``,
  ``resume``) for the settings changed most;
- ``overrides``: any other Hydra override of ``conf/config.yaml`` as one string
  (``"scheduler.V=10 dataplane.compression=fp16"``);
- ``data-dir``: the dataset folder (else ``$COLLAPIPE_DATA_DIR``);
- ``output-dir``: where the run folder is created (relative paths: from where ``flwr run`` started).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path

from flwr.common import log
from rich.console import Console
from rich.markup import escape

from collapipe_flwr.config import RunConfig, load_run_config
from collapipe_flwr.config.flower_keys import hydra_overrides
from collapipe_flwr.config.sections import OptimizerState
from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.records.progress import RoundProgress
from collapipe_flwr.fl.records.round_values import LOWER_IS_BETTER
from collapipe_flwr.fl.records.run_claim import SERVER_LOCK, FolderClaim, claim_folder
from collapipe_flwr.fl.records.run_log import RunLog, run_folder
from collapipe_flwr.fl.records.run_plots import TensorBoardLog, load_rounds, write_run_plots
from collapipe_flwr.fl.server.checkpoint import checkpoint_path, load_checkpoint, restore
from collapipe_flwr.fl.server.server_state import ServerState
from collapipe_flwr.fl.server.strategy import CollaPipeStrategy
from collapipe_flwr.fl.server.threads import torch_threads
from collapipe_flwr.model_store import save_model
from collapipe_flwr.models.hf.folder_weights import random_weights_record
from collapipe_flwr.system.clock_spec import ClockMode

FLOWER_LOGGER_NAME = "flwr"  # the logger every Flower component logs through
TENSORBOARD_SUBDIR = "tensorboard"  # <run folder>/tensorboard: the scalars of tensorboard=true
RELEASE_ON_FAILURE_S = 30.0  # how long a failed run waits for the CUs to stop their actors and drop their state


def config_from_flower(run_config: dict) -> RunConfig:
    """The one validated RunConfig from Flower's run config (``overrides``, ``data-dir``, ``output-dir``)."""
    overrides = hydra_overrides(run_config)
    top = {
        "data_dir": str(run_config.get("data-dir", "") or ""),
        "output_dir": str(run_config.get("output-dir", "") or ""),
    }
    return load_run_config(overrides, **top)


@dataclass
class _Closables:
    """What a run closes on its way out, whatever happened: the progress display, TensorBoard, the server."""

    server: ServerState | None = None
    progress: RoundProgress | None = None
    tensorboard: TensorBoardLog | None = None
    claim: FolderClaim | None = None
    release: Callable[[], int] | None = None  # tells the CUs the run is over (their actors and CU-state files go)

    def release_on_failure(self) -> None:
        """A failed run still releases the CUs it reached: their device actors stop and their CU-state files of
        this run are removed, so a failed run leaves nothing in the CU-state folder (best effort: a CU that is
        gone cannot answer)."""
        if self.release is None:
            return
        release, self.release = self.release, None
        try:
            release()
        except Exception as err:  # noqa: BLE001 - the run's own error is the one the user must see
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            log(WARNING, "the CUs could not be released after the failure: %s", first)

    def close(self) -> None:
        """Close what was opened, in this order; the run folder is given up last."""
        if self.progress is not None:
            self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.server is not None:
            self.server.shutdown()
        if self.claim is not None:
            self.claim.release()


def run_server(grid, run_config: dict, cfg: RunConfig | None = None) -> Path | None:
    """Run the whole federation; returns the run folder. A user error is logged as one line, exit 2."""
    opened = _Closables()
    t_start = time.time()
    try:
        cfg = cfg or config_from_flower(run_config)
        folder = run_folder(cfg)
        opened.claim = claim_folder(folder, SERVER_LOCK, "ServerApp")  # before anything is read or written there
        run_log = open_run_log(cfg, folder)
        console = Console(stderr=True, highlight=False, soft_wrap=True)
        console.print(escape(start_line(cfg, folder)))
        opened.server = server = ServerState.build(cfg)  # checks the partitions first, before any CU is asked
        claim_run(cfg, server, run_log)
        done = rounds_done(cfg, server, run_log, folder, console)
        opened.progress = RoundProgress(
            cfg.federation.num_rounds,
            server.task.metric_name,
            console=console,
            steps_per_round=cfg.federation.local_steps,
        )
        opened.tensorboard = TensorBoardLog(folder / TENSORBOARD_SUBDIR) if cfg.tensorboard else None
        listeners = [opened.tensorboard.add_round] if opened.tensorboard is not None else []
        strategy = CollaPipeStrategy(server, run_log, opened.progress, round_offset=done, round_listeners=listeners)
        opened.release = lambda: strategy.release_clusters(grid, timeout_s=RELEASE_ON_FAILURE_S)
        summary = train_rounds(grid, cfg, server, strategy, done)
        strategy.watch.check_run()  # no CU completed a round: a failure, not "done" with the untrained model
        write_outputs(cfg, server, folder, summary, t_start)
        run_log.write_summary(summary)
        opened.release = None
        released = strategy.release_clusters(grid)
        log(INFO, "CollaPipe: %d device actor(s) released on the CUs", released)
        for line in summary_lines(summary, folder, server.task.metric_name):
            console.print(escape(line))
        return folder
    except CollaPipeError as err:
        log(ERROR, "error: %s", err)
        print(f"error: {err}", file=sys.stderr)
        opened.release_on_failure()
        # Raised on, not SystemExit: a deployed SuperLink's flwr-serverapp catches only an Exception, records it
        # as the run's failure (`flwr ls`: "ServerApp failed with exception: ...") and flushes the run's logs;
        # a SystemExit would end the process before that and the run would read "No heartbeat received".
        raise
    except Exception as err:  # a bug, not a user error: one line first, Flower logs the traceback after it
        first = (str(err).strip().splitlines() or [""])[0][:300]
        line = f"{type(err).__name__}: {first} (an internal error: the traceback follows in the log; please report it)"
        log(ERROR, "error: %s", line)
        print(f"error: {line}", file=sys.stderr)
        opened.release_on_failure()
        raise
    finally:
        opened.close()


def open_run_log(cfg: RunConfig, folder: Path) -> RunLog:
    """The run folder's log; a resume writes its config.json first, so a resume with other settings is
    refused before anything is built."""
    run_log = RunLog(folder, resume=cfg.resume)
    if cfg.resume:
        run_log.write_config(cfg.to_dict(), resume=True)
    return run_log


def claim_run(cfg: RunConfig, server: ServerState, run_log: RunLog) -> None:
    """The server is up: a new run writes its config.json (it holds its name from now on) and a checkpointed
    run that keeps the CUs' optimizer moments gets the key of their state files."""
    if not cfg.resume:  # only a run that started holds its name: one that failed here can simply be rerun
        run_log.write_config(cfg.to_dict())
    if cfg.checkpoint and cfg.federation.optimizer_state is OptimizerState.KEEP:
        # The key of this run's CU state files (fl/cu/cu_checkpoint.py): 16 random hex digits, no other run matches;
        # a resumed run takes its own back from checkpoint.pt.
        server.cu_state_key = secrets.token_hex(8)


def rounds_done(cfg: RunConfig, server: ServerState, run_log: RunLog, folder: Path, console: Console) -> int:
    """The rounds already trained: 0, or a resumed run's checkpointed ones (its state restored); a run with
    none left to train is a ConfigError."""
    done = 0
    if cfg.resume:
        done = restore(server, load_checkpoint(folder), checkpoint_path(folder))
        run_log.keep_rounds_through(done)
        console.print(f"resuming {folder} after round {done} of {cfg.federation.num_rounds}")
    if done >= cfg.federation.num_rounds:
        raise ConfigError(f"{folder} finished all {done} rounds already; raise federation.num_rounds to go on")
    return done


def train_rounds(grid, cfg: RunConfig, server: ServerState, strategy: CollaPipeStrategy, done: int) -> dict:
    """Rounds done+1..T through Flower's strategy loop; returns the run's summary record."""
    with flower_log_level(cfg.flower_log), torch_threads(cfg.runtime.server_threads):
        result = strategy.start(
            grid,
            initial_arrays=server.global_model.array_record(),
            num_rounds=cfg.federation.num_rounds - done,
            timeout=cfg.federation.round_timeout_s,
            evaluate_fn=strategy.evaluate,
        )
    return strategy.summary_record(result)


def write_outputs(cfg: RunConfig, server: ServerState, folder: Path, summary: dict, t_start: float) -> None:
    """Save the trained model and draw the plots; ``summary`` gets where they are, the round totals and the
    wall time."""
    model_dir = save_model(
        folder,
        cfg.to_dict(),
        server.model.embedding,
        server.model.blocks,
        server.model.head,
        info={"saved_by": "flwr run", "rounds": cfg.federation.num_rounds, "val": summary.get("final_val", {})},
        task=server.task,
    )
    summary["model_dir"] = str(model_dir)
    records = load_rounds(folder)
    summary.update(round_totals(records))
    summary["clock"] = cfg.clock.mode  # which clock the run's time is read on (docs/testbed.md)
    summary.update(random_weights_record(cfg.model.hf))  # model.allow_missing_weights: what started random
    summary["plots"] = [str(p) for p in draw_plots(folder, server.task.metric_name, records)]
    summary["wall_s"] = round(time.time() - t_start, 1)


def round_totals(records: list[dict]) -> dict[str, float]:
    """Sums over the run's trained rounds (all of them, a resumed run's earlier ones too): the modelled
    round delay tau(t) of eq. 26, the measured wall time of each round and each round on the virtual clock."""
    trained = [r for r in records if r.get("round", 0) >= 1]
    return {
        "modelled_delay_s": round(
            sum(float((r.get("modelled") or {}).get("round_delay_s") or 0.0) for r in trained), 3
        ),
        "measured_round_s": round(sum(float((r.get("measured_s") or {}).get("round_s") or 0.0) for r in trained), 3),
        # the rounds on the virtual clock (fl/server/virtual_round.py): the slowest cluster + the server's part
        "virtual_round_s": round(sum(float((r.get("virtual") or {}).get("round_s") or 0.0) for r in trained), 3),
    }


def draw_plots(folder: Path, metric: str, records: list[dict]) -> list[Path]:
    """The run's PNGs (fl/records/run_plots.py); a figure that cannot be written is a warning, not a failed run."""
    try:
        return write_run_plots(folder, metric=metric, records=records)
    except CollaPipeError as err:
        log(WARNING, "the run's plots were not drawn: %s", err)
        return []


def start_line(cfg: RunConfig, folder: Path) -> str:
    """What runs and where it writes, the first line of a run."""
    f = cfg.federation
    return (
        f"CollaPipe: {cfg.task.name} / {cfg.model.name}, method {cfg.method.name} (scheduler "
        f"{cfg.scheduler.name}), {f.num_clusters} CUs x {f.num_rounds} rounds x {f.local_steps} local steps; "
        f"run folder {folder}"
    )


def time_line(summary: dict) -> str:
    """The run's times: under clock=virtual the virtual clock's first, as the run's time; the wall clock here, the
    rounds' wall seconds and eq. (26)'s modelled delay beside it."""
    virtual = (
        f"{summary.get('virtual_round_s', 0):.1f} s on the virtual clock (measured compute at the devices' speeds)"
    )
    wall = f"{summary.get('wall_s', 0):.0f} s wall, {summary.get('measured_round_s', 0):.0f} s in rounds"
    modelled = f"modelled delay of the plans {summary.get('modelled_delay_s', 0):.1f} s (sum of eq. 26 over the rounds)"
    if summary.get("clock") == ClockMode.VIRTUAL:
        return f"time: {virtual}; {wall} here; {modelled}"
    return f"time: {wall}; {modelled}; {virtual}"


def summary_lines(summary: dict, folder: Path, metric: str) -> list[str]:
    """The end of a run: final metrics, modelled and measured time, and where everything is."""
    final = summary.get("final_val") or {}
    value = final.get(metric)
    shown = "n/a" if value is None else (f"{value:.2f}" if metric == "bleu" else f"{value:.4f}")
    if metric in LOWER_IS_BETTER:
        shown += " (lower is better)"
    others = ", ".join(f"{k} {v:.4g}" for k, v in sorted(final.items()) if k not in (metric, "examples"))
    lines = [
        f"done: validation {metric} {shown}"
        + (f" ({others})" if others else "")
        + f" after {summary.get('num_rounds')} rounds",
        time_line(summary),
        f"run folder: {folder} (config.json, rounds.jsonl, summary.json, model/)",
    ]
    privacy = summary.get("privacy")
    if privacy:
        total = privacy.get("epsilon_total")
        lines.append(
            f"privacy ({privacy.get('mode')}): epsilon {'inf' if total is None else f'{total:.4g}'} at delta "
            f"{privacy.get('delta'):g} spent in total ({privacy.get('accountant')}; summary.json, docs/privacy.md)"
        )
    random = summary.get("random_weights")
    if random:
        lines.append(
            f"warning: {random['count']} weights of the model folder were missing (first: {random['first']}) and "
            "trained from random values (model.allow_missing_weights=true)"
        )
    plots = summary.get("plots") or []
    if plots:
        lines.append(f"plots: {Path(plots[0]).parent}/ ({', '.join(Path(p).name for p in plots)})")
    lines.append(f"evaluate again: python -m collapipe_flwr.apps.evaluate {folder}")
    return lines


@contextlib.contextmanager
def flower_log_level(level: str) -> Iterator[None]:
    """Flower's logger at ``level`` while the strategy runs (its round banners and final dump are INFO)."""
    logger = logging.getLogger(FLOWER_LOGGER_NAME)
    before = logger.level
    logger.setLevel(level.upper())
    try:
        yield
    finally:
        logger.setLevel(before)
