"""The checkout's folders for a test at any depth under tests/ (tests/<package>/.../test_x.py), so no test counts
its own ``.parent`` steps: ROOT, the repository root; GOLDEN_DIR, tests/golden."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = ROOT / "tests" / "golden"
