"""One sweep job: what it forwards to `flwr run` and how it is labelled, from Hydra's view of the job.

Pure functions only: the Hydra entry point (``__main__``) reads ``HydraConfig`` and hands the plain
values here; :mod:`collapipe_flwr.experiments.launch` runs the job.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collapipe_flwr.config import RunConfig, build_run_config, resolve_data_dir
from collapipe_flwr.errors import ConfigError

# Top-level keys the launcher sets itself (run-config data-dir / output-dir, and the run folder name).
LAUNCHER_KEYS = ("run_name", "output_dir", "data_dir")
GROUPS = ("task", "model", "method", "scheduler", "network", "federation")
RUN_SUBDIR = "run"
TIMEOUT_ENV = "COLLAPIPE_RUN_TIMEOUT_S"
TIMEOUT_MARGIN_S = 600.0


def override_key(override: str) -> str:
    """``"+extra.a=1"`` -> ``"extra.a"``; ``"~seed"`` -> ``"seed"`` (Hydra's +, ++ and ~ prefixes)."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def forwarded_overrides(task_overrides: Sequence[str], run_name: str = RUN_SUBDIR) -> list[str]:
    """This job's overrides for the ServerApp, minus the keys the launcher sets, plus ``run_name``."""
    kept = [o for o in task_overrides if override_key(o) not in LAUNCHER_KEYS]
    return kept + [f"run_name={run_name}"]


def concurrent_cus(cfg: RunConfig) -> int:
    """How many CUs the simulation trains at once (Ray's CPU count, flwr's init-args-num-cpus; 0 = the cores):
    runtime.concurrent_cus when set, else all N for ``decoder_update: joint``, whose barrier waits for every
    participating CU's step, and for ``ordered``, whose turnstile waits for every lower-index CU's step (with
    fewer workers than CUs the waiting CUs time out), else 0."""
    if cfg.runtime.concurrent_cus:
        return cfg.runtime.concurrent_cus
    return cfg.federation.num_clusters if cfg.federation.decoder_update.cus_wait else 0


def run_timeout_s(cfg: RunConfig, environ: Mapping[str, str] = os.environ) -> float:
    """Wall-clock limit of one `flwr run`: $COLLAPIPE_RUN_TIMEOUT_S, else T * round_timeout_s + 600 s."""
    raw = environ.get(TIMEOUT_ENV, "")
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{TIMEOUT_ENV}={raw!r} must be a number of seconds") from None
        if value <= 0:
            raise ConfigError(f"{TIMEOUT_ENV}={raw!r} must be > 0")
        return value
    return cfg.federation.num_rounds * cfg.federation.round_timeout_s + TIMEOUT_MARGIN_S


def labels_of(config: Mapping[str, Any], choices: Mapping[str, Any] | None = None) -> dict:
    """How a run is named in reports: the config group choices plus method, scheduler, V and task.

    ``config`` is a composed config (or a run's config.json); ``choices`` Hydra's group choices.
    """
    choices = {k: str(v) for k, v in (choices or {}).items() if k in GROUPS and v is not None}
    method = config.get("method") or {}
    scheduler = config.get("scheduler") or {}
    task = config.get("task") or {}
    labels = {
        "method": str(method.get("name") or choices.get("method", "")),
        "scheduler": str(scheduler.get("name") or choices.get("scheduler", "")),
        "V": scheduler.get("V"),
        "task": str(task.get("name") or choices.get("task", "")),
    }
    for group in ("model", "network", "federation"):
        labels[group] = choices.get(group) or _fallback_label(group, config)
    if (config.get("model") or {}).get("name"):  # the model actually composed (a task's default model too)
        labels["model"] = str(config["model"]["name"])
    return labels


def _fallback_label(group: str, config: Mapping[str, Any]) -> str:
    section = config.get(group) or {}
    if group == "network":
        return str(section.get("name", ""))
    if group == "model":
        size = section.get("d_model") or section.get("hidden")
        return f"{section.get('family', '')}-{size}" if section else ""
    if group == "federation" and section:
        return f"N{section.get('num_clusters')}-T{section.get('num_rounds')}"
    return ""


@dataclass(frozen=True)
class JobSpec:
    """Everything `launch` needs for one job."""

    job_dir: Path
    overrides: tuple[str, ...]
    num_supernodes: int
    data_dir: str
    timeout_s: float
    labels: dict = field(default_factory=dict)
    run_name: str = RUN_SUBDIR
    output_dir: Path | None = None  # the run-config output-dir; None = job_dir (a sweep job's folder)
    concurrent_cus: int = 0  # runtime.concurrent_cus: Ray's CPU count in the simulation (0 = the cores)

    @property
    def run_dir(self) -> Path:
        """Where the ServerApp writes config.json, rounds.jsonl, summary.json (output-dir / run_name)."""
        return (self.output_dir or self.job_dir) / self.run_name

    def with_timeout(self, timeout_s: float) -> JobSpec:
        if not timeout_s > 0:
            raise ConfigError(f"timeout {timeout_s!r} must be > 0 seconds")
        return replace(self, timeout_s=float(timeout_s))

    @property
    def overrides_text(self) -> str:
        """The ``overrides`` run-config string: shell-quoted, split again by config.split_overrides."""
        return shlex.join(self.overrides)


def check_local_gpu_share(cfg: RunConfig) -> None:
    """A simulation whose device actors share this machine's GPUs (Ray backend, no outside Ray cluster, a
    device that resolves to cuda) must fit them all at once (:func:`accelerator.check_gpu_share`)."""
    import torch

    from collapipe_flwr.accelerator import Device, check_gpu_share
    from collapipe_flwr.pipeline.runtime_spec import Backend

    rt = cfg.runtime
    on_gpu = rt.device is Device.CUDA or (rt.device is Device.AUTO and torch.cuda.is_available())
    if rt.backend is not Backend.RAY or rt.ray_address or not on_gpu or not rt.actor_num_gpus:
        return
    cus = concurrent_cus(cfg) or min(cfg.federation.num_clusters, os.cpu_count() or 1)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # all K devices: started with the first round (runtime.prestart_devices), or kept alive once a plan used them
    check_gpu_share(rt.actor_num_gpus, cfg.network.devices_per_cluster, cus, gpus)


def build_job(
    config: Mapping[str, Any],
    task_overrides: Sequence[str],
    job_dir: str | os.PathLike,
    choices: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> JobSpec:
    """Validate the composed config once (one-line ConfigError) and describe the job to launch."""
    cfg = build_run_config(config)
    data_dir = resolve_data_dir(cfg.data_dir, environ)
    check_local_gpu_share(cfg)
    return JobSpec(
        job_dir=Path(job_dir).resolve(),
        overrides=tuple(forwarded_overrides(task_overrides)),
        num_supernodes=cfg.federation.num_clusters,
        data_dir=str(data_dir),
        timeout_s=run_timeout_s(cfg, environ),
        labels=labels_of(config, choices),
        concurrent_cus=concurrent_cus(cfg),
    )
