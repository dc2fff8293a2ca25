"""Shared fixtures: the real dataset folder (absolute; found as the package finds it: $COLLAPIPE_DATA_DIR,
else ./data as `python -m collapipe_flwr.data prepare` writes it), one torch thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from collapipe_flwr.config import resolve_data_dir
from collapipe_flwr.errors import ConfigError
from tests.runtimes import DEVICE_RESOURCES

# The data plane's fixtures (``transport``, ``served``), shared by the tests/fl/dataplane/test_dataplane*.py files.
pytest_plugins = ["tests.dataplane_helpers"]

ROOT = Path(__file__).resolve().parent.parent


def _data_dir() -> Path | None:
    try:
        return resolve_data_dir(None)  # absolute, so subprocesses started elsewhere find it too
    except ConfigError:
        return None


@pytest.fixture(scope="session", autouse=True)
def _cu_state_in_a_temp_folder(tmp_path_factory):
    """The CUs' own checkpoints (fl/cu/cu_checkpoint.py) go to a temporary folder, not ~/.cache, in every test and
    every process a test starts (the variable is inherited)."""

    from collapipe_flwr.fl.cu.cu_checkpoint import STATE_DIR_ENV

    yield from _env_folder(STATE_DIR_ENV, tmp_path_factory.mktemp("cu-state"))


@pytest.fixture(scope="session", autouse=True)
def _gguf_cache_in_a_temp_folder(tmp_path_factory):
    """GGUF bases are dequantised once per test run into a temporary folder (models/hf/gguf_cache.py), not into
    ~/.cache, in every test and every process a test starts (the variable is inherited). Under pytest-xdist the
    workers share the run's folder (their base folders' parent): the cache's lock lets one build an entry while the
    others wait, so SmolLM2 is dequantised once, not once per worker (20-40 s of CPU on this machine)."""
    from collapipe_flwr.models.hf.gguf_cache import CACHE_ENV

    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / "gguf-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("gguf-cache")
    yield from _env_folder(CACHE_ENV, folder)


def _env_folder(name: str, folder):
    """Set the environment variable ``name`` to ``folder`` for the session (processes inherit it), then restore it."""
    import os

    previous = os.environ.get(name)
    os.environ[name] = str(folder)
    yield
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = _data_dir()
    if path is None:
        pytest.skip("real datasets not found: run `python -m collapipe_flwr.data prepare` or set COLLAPIPE_DATA_DIR")
    return path


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One tokenizer cache (``COLLAPIPE_CACHE_DIR``) for a test module: a byte-level BPE is trained once."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLAPIPE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs and two device boxes' ``DEVICE_RESOURCES``) for every Ray-backed test of a
    pytest process, shut down at the session's end if it started it; skipped where Ray is not installed.
    Session-wide, not per module: one instance for the ten modules that use it (timed alternating on 2026-11-30, a
    start per module cost no measurable time more on that host; README). The tests kill only the actors they started
    (``ray.kill``, device-memory kills), which leaves the instance sound for the next module."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as pipeline.executors.ensure_ray does
        ray.init(
            num_cpus=2,
            resources=dict(DEVICE_RESOURCES),
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=False,
        )
    yield ray
    if started:
        ray.shutdown()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The random order's seed at the end of every run (pytest-randomly prints it in the header, which ``-q``
    hides), so a failure seen in CI can be replayed in the same order."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(
            f"test order: --randomly-seed={seed} (replay: python -m pytest -q -p randomly --randomly-seed={seed})"
        )
