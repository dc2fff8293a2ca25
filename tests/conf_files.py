"""Reading one file of a config group directly (no Hydra), with top-level keys overridden."""

from __future__ import annotations

from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parent.parent / "conf"


def conf_group(group: str, name: str, **over) -> dict:
    cfg = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
    cfg.update(over)
    return cfg
