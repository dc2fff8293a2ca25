"""``collapipe run``: Flower's ``flwr run . --stream`` in one command, with nothing to export.

It runs Flower's own command, printed before it starts, and does around it what every user would otherwise
do by hand:

- validates the run config once (the same flat keys and ``overrides`` as ``flwr run . --run-config``,
  parsed by Flower's own parser) and refuses a bad one with one line and exit code 2 before anything starts;
- finds the data folder (the ``data-dir`` key, ``$COLLAPIPE_DATA_DIR``, else ``./data``: config.resolve_data_dir)
  and fixes the run folder (``output-dir``/``run-name``, a fresh name when none is given), and says both in
  its first line;
- gives the run a private FLWR_HOME and free local SuperLink ports, so two runs on one machine never meet,
  and one simulated SuperNode per cluster (``num-supernodes`` follows ``num-clusters``);
- streams the log to the console and to ``<run folder>/flwr.log`` (a few known Flower lines that do not
  apply here are left off the console only: ``console_echo.QUIET_LINES``; ``--verbose`` shows them);
- stops the local SuperLink and every process it started, by pid, when the run ends, fails, times out
  or is interrupted;
- exits 0 only when the run wrote its summary.json (``flwr run`` itself exits 0 when the ServerApp fails),
  1 when the run failed (with its one-line reason), 2 for a bad config.

The sweep jobs of ``python -m collapipe_flwr.experiments`` go through the same launcher
(:mod:`collapipe_flwr.experiments.launch`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from collapipe_flwr.errors import CollaPipeError, ConfigError

DEFAULT_OUTPUT_DIR = "runs"


def parse_run_config(args: Sequence[str]) -> dict[str, Any]:
    """``--run-config`` arguments exactly as ``flwr run`` reads them ("k=v ..." strings or one TOML file),
    restricted to the app's keys (``[tool.flwr.app.config]``)."""
    from collapipe_flwr.config.flower_keys import FLAT_KEYS, OTHER_KEYS
    from collapipe_flwr.flower_internals import parse_config_args

    try:
        parsed = dict(parse_config_args(list(args))) if args else {}
    except (ValueError, OSError) as err:
        raise ConfigError(f"cannot read --run-config: {str(err).splitlines()[0]}") from None
    known = set(FLAT_KEYS) | set(OTHER_KEYS)
    unknown = sorted(set(parsed) - known)
    if unknown:
        raise ConfigError(
            f"unknown run-config key {unknown[0]!r}; use one of {', '.join(sorted(known))} "
            '(any other setting goes inside overrides="...")'
        )
    return parsed


def plan_launch(run_config: Mapping[str, Any], cwd: Path | None = None):
    """The validated config and the sweep-style job that runs it (run folder and data folder absolute)."""
    from collapipe_flwr.config import load_run_config, resolve_data_dir
    from collapipe_flwr.config.flower_keys import hydra_overrides
    from collapipe_flwr.experiments.job import (
        JobSpec,
        check_local_gpu_share,
        concurrent_cus,
        labels_of,
        override_key,
        run_timeout_s,
    )
    from collapipe_flwr.fl.records.run_log import run_folder

    cwd = cwd or Path.cwd()
    overrides = hydra_overrides(run_config)
    output_dir = Path(str(run_config.get("output-dir") or DEFAULT_OUTPUT_DIR)).expanduser()
    output_dir = output_dir if output_dir.is_absolute() else cwd / output_dir
    cfg = load_run_config(overrides, data_dir=str(run_config.get("data-dir") or ""), output_dir=str(output_dir))
    data_dir = resolve_data_dir(cfg.data_dir)
    check_local_gpu_share(cfg)
    folder = run_folder(cfg)
    forwarded = [o for o in overrides if override_key(o) != "run_name"] + [f"run_name={folder.name}"]
    job = JobSpec(
        job_dir=folder,
        overrides=tuple(forwarded),
        num_supernodes=cfg.federation.num_clusters,
        data_dir=str(data_dir),
        timeout_s=run_timeout_s(cfg),
        labels=labels_of(cfg.to_dict()),
        run_name=folder.name,
        output_dir=folder.parent,
        concurrent_cus=concurrent_cus(cfg),
    )
    return cfg, job


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a batch system's stop) handled as Ctrl-C: the launcher stops the local SuperLink and
    everything it started before this process exits (the default SIGTERM ended only this process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, flwr_exe: str | None = None) -> int:
    """``collapipe run``; ``flwr_exe`` replaces the flwr CLI (tests use a stand-in)."""
    from collapipe_flwr.experiments.console_echo import ConsoleEcho
    from collapipe_flwr.experiments.job_status import LOG_FILE
    from collapipe_flwr.experiments.launch import launch
    from collapipe_flwr.fl.records.run_claim import RunFolderBusy
    from collapipe_flwr.fl.records.run_log import check_run_folder

    t0 = time.monotonic()
    try:
        cfg, job = plan_launch(parse_run_config(args.run_config))
        if args.timeout:
            job = job.with_timeout(float(args.timeout))
        # the server would refuse this folder: say so now, before flwr.log or status.json overwrite its files
        check_run_folder(job.run_dir, cfg.resume)
        if cfg.resume:  # a missing, damaged or hostile checkpoint.pt: refused here with exit 2 (read, never run)
            from collapipe_flwr.fl.server.checkpoint import load_checkpoint

            load_checkpoint(job.run_dir)  # mapped, not read: its sizes are bounded before anything is allocated
    except CollaPipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    f = cfg.federation
    out.write(
        f"collapipe: {cfg.task.name} / {cfg.model.name}, method {cfg.method.name} ({cfg.scheduler.name}), "
        f"{f.num_clusters} CUs x {f.num_rounds} rounds x {f.local_steps} steps; data {job.data_dir}\n"
        f"collapipe: run folder {job.run_dir} (log: {job.job_dir / LOG_FILE})"
        + (f"; stops after {job.timeout_s:.0f} s" if args.timeout else "")
        + "\n"
    )
    out.flush()
    try:
        with terminate_as_interrupt():
            status = launch(job, echo=ConsoleEcho(out, args.verbose), flwr_exe=flwr_exe, keep_logs=cfg.resume)
    except RunFolderBusy as err:  # another live run of this name: refused before anything of it is touched
        print(f"error: {err}", file=sys.stderr)
        return 2
    except CollaPipeError as err:  # the run folder could not be made (a full or read-only disk)
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; the run's processes were stopped", file=sys.stderr)
        return 130
    took = time.monotonic() - t0
    if status["ok"]:
        out.write(f"collapipe: finished in {took:.0f} s; results in {job.run_dir}\n")
        if status.get("memory"):  # experiments/run_memory.py: the summed PSS of every process of the run
            out.write(f"collapipe: {status['memory']}; per process in {job.job_dir / 'memory.json'}\n")
        return 0
    print(f"error: {status['error']} (log: {job.job_dir / LOG_FILE})", file=sys.stderr)
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collapipe", description="CollaPipe on Flower: run a simulation.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser(
        "run",
        help="run `flwr run . --stream` with a private Flower home, free ports and clean-up",
        description=(
            "Run the ServerApp and one simulated SuperNode per cluster on this machine through Flower's "
            "`flwr run`, with nothing to export."
        ),
    )
    run_p.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar="'KEY=VALUE ...'",
        help="as for flwr run: num-server-rounds, task, model, method, scheduler, num-clusters, local-steps, "
        "precision, run-name, resume, overrides, data-dir, output-dir (repeatable, or one .toml file)",
    )
    run_p.add_argument("--timeout", type=float, default=0.0, help="stop the run after this many seconds")
    run_p.add_argument("--verbose", action="store_true", help="also show the Flower lines left off by default")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    raise SystemExit(main())
