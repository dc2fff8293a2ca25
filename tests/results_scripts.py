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
