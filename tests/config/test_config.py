"""One config object, validated once: bad values give one-line errors that name the key and the fix."""

from __future__ import annotations

import pytest

from collapipe_flwr.config import build_run_config, compose, load_run_config, resolve_data_dir, split_overrides
from collapipe_flwr.errors import ConfigError
from tests.paths import ROOT


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_default_config_composes_and_validates(data_dir):
    cfg = load_run_config([], data_dir=str(data_dir))
    assert cfg.method.name == "collapipe"
    assert cfg.federation.num_clusters >= 1
    assert cfg.resolved_data_dir() == data_dir.resolve()
    # the resolved dict round-trips (this is what travels to the CUs)
    assert build_run_config(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "override,needle",
    [
        ("federation.num_clusters=0", "federation.num_clusters"),
        ("federation.local_steps=abc", "federation.local_steps"),
        ("runtime.backend=gpu", "runtime.backend"),
        ("+runtime.colour=red", "runtime.colour"),
        ("dataplane.port=70000", "dataplane.port"),
        ("method.fixed_m=-1", "method.fixed_m"),
        ("save_client_weights=maybe", "save_client_weights"),
    ],
)
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError) as err:
        build_run_config(compose([override]))
    assert needle in _one_line(err)


def test_unknown_group_option_is_one_line():
    with pytest.raises(ConfigError) as err:
        compose(["task=nonexistent"])
    assert "nonexistent" in _one_line(err)


def test_overrides_string_is_split_shell_style():
    assert split_overrides('task=ner run_name="a b"') == ["task=ner", "run_name=a b"]
    with pytest.raises(ConfigError):
        split_overrides('task="unclosed')


def test_missing_data_dir_says_how_to_fix(monkeypatch, tmp_path):
    import collapipe_flwr.config.data_dir as config_module

    monkeypatch.delenv("COLLAPIPE_DATA_DIR", raising=False)
    monkeypatch.setattr(config_module, "default_data_dirs", lambda cwd=None: [tmp_path / "data"])
    with pytest.raises(ConfigError) as err:
        resolve_data_dir("")
    assert "COLLAPIPE_DATA_DIR" in _one_line(err) and "collapipe_flwr.data prepare" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        resolve_data_dir(tmp_path / "nope")
    assert "does not exist" in _one_line(err)


def test_a_task_without_a_model_gets_the_tasks_default_model():
    assert compose(["task=ner"])["model"]["name"] == compose(["task=ner"])["task"]["default_model"] == "bert_small"
    assert compose(["task=classification", "model=bert_tiny"])["model"]["name"] == "bert_tiny"
    assert compose([])["model"]["name"] == "transformer_small"


def test_data_dir_defaults_to_data_in_the_working_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("COLLAPIPE_DATA_DIR", raising=False)
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_data_dir("") == (tmp_path / "data").resolve()
    monkeypatch.setenv("COLLAPIPE_DATA_DIR", str(tmp_path))  # the variable wins over the default
    assert resolve_data_dir("") == tmp_path.resolve()


@pytest.mark.parametrize(
    ("pattern", "want"), [("device_", {"device_0": 1.0}), ("box_{k}_cpu", {"box_0_cpu": 1.0}), ("", None)]
)
def test_device_resource_names_device_ks_ray_resource_and_needs_no_quoting_in_an_override(pattern, want):
    from collapipe_flwr.pipeline.executors.ray_actor import device_resources

    cfg = load_run_config([f"runtime.device_resource={pattern}"] if "{" not in pattern else [])
    if "{" not in pattern:
        assert cfg.runtime.device_resource == pattern
    assert device_resources(pattern, 0) == ({"resources": want} if want else {})
    assert device_resources("device_", 3) == {"resources": {"device_3": 1.0}}  # the README's devices 0..K-1


def test_a_device_resource_that_is_no_resource_name_is_refused():
    with pytest.raises(ConfigError, match=r"runtime.device_resource='device k'.*letters, digits and _"):
        load_run_config(["runtime.device_resource='device k'"])


def test_federation_long_on_ner_carries_the_central_ner_recipe_and_overrides_still_win():
    """docs/central_training.md's NER recipe (b 32, 128 tokens, the MSRA supplement, lr 7e-4, 100 warm-up steps to
    0.05x, dropout 0.2), written out here by hand; other tasks and sizes keep the task and model defaults."""
    cfg = compose(["task=ner", "federation=long"])
    assert (cfg["task"]["batch_size"], cfg["task"]["max_len"]) == (32, 128)
    assert cfg["task"]["extra_train_files"] == ["chinese_ner/supplementary_msra/msra_bio.txt"]
    assert (cfg["model"]["dropout"], cfg["model"]["optimizer"]["lr"]) == (0.2, 0.0007)
    assert cfg["model"]["lr_schedule"]["warmup_steps"] == 100 and cfg["model"]["lr_schedule"]["min_factor"] == 0.05
    assert cfg["federation"]["num_rounds"] == 60 and cfg["network"]["uplink"]["energy_max_j"] == 1000.0
    assert compose(["task=ner", "federation=long", "task.batch_size=16"])["task"]["batch_size"] == 16
    assert compose(["task=ner"])["task"]["batch_size"] == 64  # federation=small: Table II's b
    assert compose(["task=classification", "federation=long"])["model"]["dropout"] == 0.1


@pytest.mark.parametrize(
    "override,needle",
    [
        ("testbed=emulated testbed.fastest_cores=inf", "testbed.fastest_cores=inf must be a finite number"),
        ("task.partition=dirichlet task.alpha=inf", "task.alpha=inf must be a finite number"),
        ("network.uplink.energy_max_j=nan", "network.uplink.energy_max_j=nan must be a finite number"),
        ("federation.round_timeout_s=-inf", "federation.round_timeout_s=-inf must be a finite number"),
    ],
)
def test_no_setting_takes_a_non_finite_number(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace(".", r"\.")):
        load_run_config(override.split())


def test_testbed_cores_above_the_machines_are_refused_since_the_quota_would_throttle_nothing():
    import os

    have = len(os.sched_getaffinity(0))
    for override in (f"testbed.fastest_cores={have + 1}", f"testbed.cpu_cores=[1,{have + 0.5}]"):
        with pytest.raises(ConfigError, match=f"exceed this machine's {have} usable cores"):
            load_run_config(["testbed=emulated", override])
    assert load_run_config(["testbed=emulated", f"testbed.fastest_cores={have}"]).testbed.fastest_cores == have


def test_the_default_transport_is_one_name_everywhere():
    """conf/config.yaml, the typed config and the data plane's own specs give a run the same transport."""
    import yaml

    from collapipe_flwr.config.sections import DataPlaneSpec
    from collapipe_flwr.fl.dataplane import DecoderClientSpec
    from collapipe_flwr.fl.dataplane.backend import DEFAULT_TRANSPORT
    from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec

    conf = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    assert conf["dataplane"]["transport"] == DataPlaneSpec().transport == DEFAULT_TRANSPORT == "socket"
    assert DecoderClientSpec().transport == DecoderHostSpec(hidden_size=8).transport == DEFAULT_TRANSPORT
