"""precision: auto follows the hardware check, emulated bf16 warns once, autocast sets the compute dtype."""

from __future__ import annotations

import warnings

import pytest
import torch

from collapipe_flwr import precision
from collapipe_flwr.errors import ConfigError


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees a process that has not warned yet."""
    monkeypatch.setattr(precision, "_warned", set())


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_follows_native_support(monkeypatch, fresh_warnings, native, expected):
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": native)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("auto") == expected
        assert precision.resolve_precision("fp32") == "fp32"


def test_bf16_without_native_support_warns_once(monkeypatch, fresh_warnings):
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert precision.resolve_precision("bf16") == "bf16"
        assert precision.resolve_precision("bf16") == "bf16"
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1
    text = str(runtime[0].message)
    assert "emulated" in text and "AVX512-BF16/AMX" in text and "auto" in text and "fp32" in text


def test_bf16_with_native_support_is_silent(monkeypatch, fresh_warnings):
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("bf16") == "bf16"


def test_cpu_flags_decide_native_support(monkeypatch, tmp_path):
    native = tmp_path / "native"
    native.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    unreadable = tmp_path / "missing"
    precision.native_bf16.cache_clear()
    try:
        monkeypatch.setattr(precision, "CPUINFO", native)
        assert precision.native_bf16("cpu") is True
        precision.native_bf16.cache_clear()
        monkeypatch.setattr(precision, "CPUINFO", plain)
        assert precision.native_bf16("cpu") is False
        precision.native_bf16.cache_clear()
        monkeypatch.setattr(precision, "CPUINFO", unreadable)
        monkeypatch.setattr(precision, "_mkldnn_bf16", lambda: True)
        assert precision.native_bf16("cpu") is True
    finally:
        precision.native_bf16.cache_clear()


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_autocast_sets_the_linear_output_dtype(name, dtype):
    layer = torch.nn.Linear(8, 4)
    with precision.autocast(name):
        out = layer(torch.randn(2, 8))
    assert out.dtype == dtype
    assert layer.weight.dtype == torch.float32


def test_bad_names_are_config_errors():
    with pytest.raises(ConfigError, match="auto, fp32, bf16"):
        precision.resolve_precision("fp16")
    with pytest.raises(ConfigError, match="fp32 or bf16"):
        precision.autocast("auto")
