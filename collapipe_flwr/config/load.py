"""Compose and validate in one call: :func:`load_run_config`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collapipe_flwr.config.hydra_conf import compose
from collapipe_flwr.config.run_config import RunConfig, build_run_config


def load_run_config(overrides: Sequence[str] | str = (), **top_level: Any) -> RunConfig:
    """Compose + validate. ``top_level`` (e.g. ``data_dir=...``) wins over the composed values."""
    data = compose(overrides)
    for key, value in top_level.items():
        if value not in (None, ""):
            data[key] = value
    return build_run_config(data)
