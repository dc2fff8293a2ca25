"""The dssra config sections (dssra/specs.py) and the two registries behind their names: every preset in
conf/method and conf/scheduler parses and round-trips through ``to_raw``; bad values are one-line errors;
the registries hold exactly the presets' names however the package was imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import collapipe_flwr
from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.dssra.method_registry import METHODS, register_method
from collapipe_flwr.dssra.selectors import SELECTORS
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec, parse_method, parse_scheduler
from collapipe_flwr.errors import ConfigError

METHOD_PRESETS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
SCHEDULER_PRESETS = sorted(p.stem for p in (CONF_DIR / "scheduler").glob("*.yaml"))


def conf(group: str, name: str) -> dict:
    return yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())


def test_registries_match_the_presets():
    assert sorted(METHODS) == METHOD_PRESETS == ["collapipe", "collapipe_no_ss", "pipeline", "titanic", "vanilla_fl"]
    assert sorted(SELECTORS) == SCHEDULER_PRESETS == ["delay_only", "dssra", "loss_only", "random", "uniform"]


@pytest.mark.parametrize("name", METHOD_PRESETS)
def test_method_presets_round_trip(name):
    raw = conf("method", name)
    spec = parse_method(raw)
    assert spec.name == name
    assert spec.to_raw() == raw
    assert parse_method(spec.to_raw()) == spec


@pytest.mark.parametrize("name", SCHEDULER_PRESETS)
def test_scheduler_presets_round_trip(name):
    raw = conf("scheduler", name)
    spec = parse_scheduler(raw)
    assert isinstance(spec, SchedulerSpec) and spec.name == name
    assert parse_scheduler(spec.to_raw()) == spec
    assert spec.to_raw()["convergence"] == {k: float(v) for k, v in raw["convergence"].items()}
    assert spec.segment_scheduling == raw["segment_scheduling"]


def test_scheduler_defaults_and_forced_segment_scheduling():
    minimal = {"name": "dssra", "V": 1, "convergence": {"gamma_max": 0.5}}
    spec = parse_scheduler(minimal)
    assert (spec.segment_scheduling, spec.fixed_m, spec.max_m, spec.drift) == (True, 4, 0, "gamma")
    assert spec.bcd_max_iters == 5
    assert (spec.beta, spec.eta, spec.grad_bound, spec.interference_c) == (1.0, 0.1, 1.0, 0.01)
    assert parse_scheduler(spec.to_raw()) == spec
    # uniform forces equal blocks whatever the key says
    assert parse_scheduler(dict(minimal, name="uniform", segment_scheduling=True)).segment_scheduling is False


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"name": "x"}, r"method.name='x' is not one of collapipe, collapipe_no_ss, pipeline, titanic, vanilla_fl"),
        ({"zeta": 1}, r"method.zeta"),
        ({"fixed_m": -1}, r"method.fixed_m"),
        ({"aggregate": "yes"}, r"method.aggregate"),
        ({"fixed_m": 2.0}, r"method.fixed_m"),
    ],
)
def test_method_errors_are_one_line(bad, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_method({**conf("method", "collapipe"), **bad})
    assert "\n" not in str(err.value)


def test_method_and_scheduler_must_be_mappings():
    with pytest.raises(ConfigError, match="method"):
        parse_method(["collapipe"])
    with pytest.raises(ConfigError, match="scheduler config must be a mapping"):
        parse_scheduler("dssra")
    with pytest.raises(ConfigError, match="scheduler.name"):
        parse_scheduler({"name": ["dssra"], "V": 1})


def test_registering_a_name_twice_is_refused():
    """Against the filled registry (read first, as any use does), so the refusal does not depend on whether an
    earlier test in this process happened to fill it; the real planner stays registered either way."""
    real = METHODS["collapipe"]
    with pytest.raises(ValueError, match="registered twice"):
        register_method("collapipe")(lambda *a: None)
    assert METHODS["collapipe"] is real


@pytest.mark.e2e
def test_method_registry_fills_itself_on_first_use():
    """A fresh interpreter that imports only the specs still knows every method (pkgutil discovery)."""
    code = (
        "from collapipe_flwr.dssra.specs import MethodSpec, parse_method\n"
        "import collapipe_flwr.dssra.method_registry as r\n"
        "assert not r._FACTORIES\n"
        "assert parse_method({'name': 'titanic'}) == MethodSpec(name='titanic', segment_scheduling=True)\n"
        "print(','.join(r.METHODS))\n"
    )
    root = str(Path(collapipe_flwr.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "collapipe,collapipe_no_ss,pipeline,titanic,vanilla_fl"


def test_method_spec_is_the_typed_section():
    assert MethodSpec() == parse_method({}) == parse_method(None)
    assert parse_method({"name": "pipeline", "aggregate": False}).to_raw() == {
        "name": "pipeline",
        "segment_scheduling": True,
        "fixed_m": 4,
        "head_on_server": True,
        "aggregate": False,
    }
