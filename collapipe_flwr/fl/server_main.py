"""The ServerApp's body: compose + validate the config once, build the server state, run T rounds.

Run config keys (``[tool.flwr.app.config]``, overridable with ``flwr run . --run-config``):
- the flat keys of :data:`collapipe_flwr.fl.run_config.FLAT_KEYS` (``num-server-rounds``, ``task``,
  ``model``, ``method``, ``scheduler``, ``num-clusters``, ``local-steps``, ``precision``, ``run-name``,
  ``resume``) for the settings changed most;
- ``overrides``: any other Hydra override of ``conf/config.yaml`` as one string
  (``"scheduler.V=10 dataplane.fp16=true"``);
- ``data-dir``: the dataset folder (else ``$COLLAPIPE_DATA_DIR``);
- ``output-dir``: where the run folder is created (relative paths: from where ``flwr run`` started).
"""

from __future__ import annotations

import sys
import time
from logging import ERROR, INFO
from pathlib import Path

from flwr.common import log

from collapipe_flwr.config import RunConfig, load_run_config
from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.checkpoint import load_checkpoint, restore
from collapipe_flwr.fl.progress import RoundProgress
from collapipe_flwr.fl.run_config import hydra_overrides
from collapipe_flwr.fl.run_log import RunLog
from collapipe_flwr.fl.server_state import ServerState
from collapipe_flwr.fl.strategy import CollaPipeStrategy
from collapipe_flwr.model_store import save_model


def config_from_flower(run_config: dict) -> RunConfig:
    """The one validated RunConfig from Flower's run config (``overrides``, ``data-dir``, ``output-dir``)."""
    overrides = hydra_overrides(run_config)
    top = {
        "data_dir": str(run_config.get("data-dir", "") or ""),
        "output_dir": str(run_config.get("output-dir", "") or ""),
    }
    return load_run_config(overrides, **top)


def run_folder(cfg: RunConfig) -> Path:
    if cfg.resume and not cfg.run_name:
        raise ConfigError("resume=true needs the run_name of the run to continue (run_name=<name>)")
    name = cfg.run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{cfg.method.name}-{cfg.task.name}"
    return Path(cfg.output_dir).expanduser().resolve() / name


def run_server(grid, run_config: dict, cfg: RunConfig | None = None) -> Path | None:
    """Run the whole federation; returns the run folder. A user error is logged as one line, exit 2."""
    server = strategy = None
    t_start = time.time()
    try:
        cfg = cfg or config_from_flower(run_config)
        folder = run_folder(cfg)
        run_log = RunLog(folder, resume=cfg.resume)
        run_log.write_config(cfg.to_dict(), resume=cfg.resume)
        log(INFO, "CollaPipe run folder: %s", folder)
        server = ServerState.build(cfg)
        done = 0
        if cfg.resume:
            done = restore(server, load_checkpoint(folder))
            run_log.keep_rounds_through(done)
            log(INFO, "CollaPipe: resuming %s after round %d of %d", folder, done, cfg.federation.num_rounds)
        if done >= cfg.federation.num_rounds:
            raise ConfigError(f"{folder} finished all {done} rounds already; raise federation.num_rounds to go on")
        progress = RoundProgress(cfg.federation.num_rounds, server.task.metric_name)
        strategy = CollaPipeStrategy(server, run_log, progress, round_offset=done)
        result = strategy.start(
            grid,
            initial_arrays=server.global_model.array_record(),
            num_rounds=cfg.federation.num_rounds - done,
            timeout=cfg.federation.round_timeout_s,
            evaluate_fn=strategy.evaluate,
        )
        summary = strategy.summary_record(result)
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
        summary["wall_s"] = round(time.time() - t_start, 1)
        run_log.write_summary(summary)
        metric = server.task.metric_name
        value = summary.get("final_val", {}).get(metric)
        shown = "n/a" if value is None else (f"{value:.2f}" if metric == "bleu" else f"{value:.4f}")
        progress.console.print(
            f"[bold]done[/bold]: validation {metric} {shown} after {cfg.federation.num_rounds} rounds in "
            f"{summary['wall_s']:.0f} s | run folder {folder} | evaluate: python -m collapipe_flwr.evaluate {folder}"
        )
        released = strategy.release_clusters(grid)
        log(INFO, "CollaPipe: %d device actor(s) released on the CUs", released)
        return folder
    except CollaPipeError as err:
        log(ERROR, "error: %s", err)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if server is not None:
            server.shutdown()
