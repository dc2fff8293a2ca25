"""Load a script of results/ (not a package: each runs as ``python results/<name>.py``) as a module for a test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RESULTS = Path(__file__).resolve().parent.parent / "results"


def load(name: str) -> ModuleType:
    """``results/<name>.py`` as the module ``name``, registered in sys.modules (its dataclasses look it up there);
    results/ goes on ``sys.path`` first, as running the script puts it (its siblings and ``reportlib`` import)."""
    if str(RESULTS) not in sys.path:
        sys.path.insert(0, str(RESULTS))
    spec = importlib.util.spec_from_file_location(name, RESULTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def modelled_section(round_delay_s: float, clusters: list[dict]) -> dict:
    """A rounds.jsonl ``modelled`` section as the server writes it (``ModelledRound.to_dict``): ``round_delay_s`` and
    each cluster's figures given in ``clusters`` (e.g. ``{"delay_s": 3.0}``), every other figure 0."""
    from collapipe_flwr.dssra.plan import ModelledCluster, ModelledRound

    zero = {"pipeline_s": 0.0, "compute_s": 0.0, "d2d_s": 0.0, "overhead_s": 0.0, "uplink_s": 0.0, "delay_s": 0.0}
    typed = tuple(
        ModelledCluster(**{**zero, **c}, device_energy_j=(), cu_energy_j=0.0, gamma=0.0, Y=0.0) for c in clusters
    )
    figures = {"objective": 0.0, "bcd_objective": (), "bcd_iterations": 0, "uplink_bits": 0.0, "gamma_mean": 0.0}
    plan = ModelledRound(
        "collapipe", "dssra", V=1.0, round_delay_s=round_delay_s, gamma_max=1.0, clusters=typed, **figures
    )
    return plan.to_dict()
