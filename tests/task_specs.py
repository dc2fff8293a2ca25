"""The task and model specs of one conf/task and one conf/model file (no Hydra), keys overridden."""

from __future__ import annotations

from collapipe_flwr.tasks.spec import ModelSpec, TaskSpec, parse_model, parse_task
from tests.conf_files import conf_group


def specs(
    task: str, model: str, task_over: dict | None = None, model_over: dict | None = None
) -> tuple[TaskSpec, ModelSpec]:
    task_spec = parse_task(conf_group("task", task, **(task_over or {})))
    return task_spec, parse_model(conf_group("model", model, **(model_over or {})), task_spec)
