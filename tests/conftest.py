"""Shared fixtures: the real dataset folder (../shared/data or $COLLAPIPE_DATA_DIR), one torch thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _data_dir() -> Path | None:
    value = os.environ.get("COLLAPIPE_DATA_DIR") or str(ROOT.parent / "shared" / "data")
    path = Path(value)
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = _data_dir()
    if path is None:
        pytest.skip("real datasets not found: set COLLAPIPE_DATA_DIR to the shared data folder")
    return path


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield
