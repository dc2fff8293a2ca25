"""Hydra entry point: ``python -m collapipe_flwr.experiments [overrides]`` (``-m`` sweeps).

Composes the repo's ``conf/config.yaml`` (the same file `flwr run .` composes), validates it once, and
trains each job through the Flower simulation path (:mod:`collapipe_flwr.experiments.launch`).
Each job's records land in ``<hydra job folder>/run/`` (config.json, rounds.jsonl, summary.json), next
to ``status.json``, ``flwr.log`` and Hydra's ``.hydra/``. Examples::

    python -m collapipe_flwr.experiments task=translation model=transformer_tiny federation=tiny
    python -m collapipe_flwr.experiments -m method=collapipe,collapipe_no_ss scheduler.V=0.01,10,100
    python -m collapipe_flwr.experiments.report multirun/<date>/<time>

A config error or a crashed / timed-out run writes ``status.json`` with ``ok: false`` and one error
line; in a multirun the sweep goes on, a single run exits with code 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from collapipe_flwr.config import CONF_DIR, compose, with_task_default_model
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.experiments.job import build_job, labels_of
from collapipe_flwr.experiments.job_status import failed_status
from collapipe_flwr.experiments.launch import launch
from collapipe_flwr.fl.records.run_claim import RunFolderBusy


def run_job(config: dict, task_overrides: list[str], job_dir: str, choices: dict | None = None) -> dict:
    """Validate, launch, and return the job's status (never raises for a user error)."""
    try:
        with_model = with_task_default_model(list(task_overrides), config)
        if with_model is not None:  # task chosen without a model: the task's default model, as in `flwr run`
            task_overrides, config = with_model, compose(with_model)
        job = build_job(config, task_overrides, job_dir, choices)
    except CollaPipeError as err:
        return failed_status(job_dir, str(err), labels_of(config, choices), overrides=list(task_overrides))
    try:
        return launch(job)
    except RunFolderBusy as err:  # another live launcher holds the job's folder: its status.json is left alone
        return {"ok": False, "error": str(err), "run_dir": str(job.run_dir), "labels": labels_of(config, choices)}


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    overrides, job_dir = list(hydra_cfg.overrides.task), hydra_cfg.runtime.output_dir
    choices = dict(hydra_cfg.runtime.choices)
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # noqa: BLE001 - an unresolvable ${...} is a config error of this job
        message = f"cannot resolve the config: {str(err).splitlines()[0]}; fix the ${{...}} interpolation"
        status = failed_status(job_dir, message, {}, overrides=overrides)
    else:
        if not isinstance(config, dict):  # unreachable: @hydra.main gives a DictConfig, which converts to a dict
            raise TypeError(f"the composed config is a {type(config).__name__}, not a mapping")
        status = run_job(config, overrides, job_dir, choices)
    if status["ok"]:
        print(f"run ok: {status['run_dir']}")
    else:
        print(f"error: {status['error']}", file=sys.stderr)
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise SystemExit(2)


if __name__ == "__main__":
    main()
