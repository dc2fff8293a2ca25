"""devtools/arch_check.py (issue 47) against a small hand-built package whose findings are known."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "devtools" / "arch_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("arch_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["arch_check"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


arch_check = _load()


def _function(name: str, n_lines: int) -> str:
    """A function of exactly n_lines from its def line to the end of its body (decorator not counted)."""
    body = [f"    x{i} = {i}" for i in range(n_lines - 2)]
    return "\n".join(["@staticmethod", f"def {name}():", *body, "    return 0", ""])


NINE = "a, b, c, d, e, f, g, h, i"

WIDE = f'''
def wide_with_reason({NINE}):
    """Does it.

    Over eight parameters: the paper's formula takes them all.
    """


def wide_without_reason({NINE}):
    """Does it.

    Parameters: a to i, one per symbol.
    """


def wide_empty_reason({NINE}):
    """Over eight parameters:"""


def wide_star(a, b, c, d, e, f, g, *args, k=1, **kwargs):
    pass


class Holder:
    def __init__(self, a, b, c, d, e, f, g, h):
        pass
'''

CALLS = """
def drive(stages, k, x, method):
    stages.submit(k, "forward", x)
    stages.submit(k, method, x)
    stages.submit("forward")
    stages.call_device(k, "get_weights")
"""

EXECUTOR = """
def dispatch(obj, method, handle):
    getattr(obj, method)()
    getattr(obj, "fixed")()
    dtype = getattr(obj, handle.dtype)
    getattr(obj, method).remote(1)
"""


@pytest.fixture
def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "pipeline" / "executors").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "big.py").write_text("\n".join(f"x{i} = {i}" for i in range(401)) + "\n")
    (pkg / "limit.py").write_text("\n".join(f"x{i} = {i}" for i in range(400)) + "\n")
    (pkg / "lengths.py").write_text(_function("long61", 61) + "\n\n" + _function("fits60", 60))
    (pkg / "wide.py").write_text(WIDE)
    (pkg / "pipeline" / "calls.py").write_text(CALLS + EXECUTOR)  # getattr outside executors/: not flagged
    (pkg / "pipeline" / "executors" / "local.py").write_text(EXECUTOR)
    return pkg


def test_findings(package: Path):
    report = arch_check.scan(package)

    wide = {w.name: (w.params, w.reason) for w in report.wide}
    assert wide == {
        "wide_with_reason": (9, "the paper's formula takes them all."),
        "wide_without_reason": (9, ""),
        "wide_empty_reason": (9, ""),
        "wide_star": (10, ""),  # a..g, *args, k, **kwargs
    }  # not Holder.__init__: self + 8
    assert report.wide[0].where == "pkg/wide.py:2"

    assert [(f.name, f.lines) for f in report.long_functions] == [("long61", 61)]
    assert report.long_functions[0].where == "pkg/lengths.py:2"  # the def line, after the decorator

    assert [(f.where, f.lines) for f in report.long_files] == [("pkg/big.py", 401)]

    assert [(c.where, c.kind, c.name) for c in report.name_calls] == [
        ("pkg/pipeline/calls.py:3", "submit", "forward"),
        ("pkg/pipeline/calls.py:6", "call_device", "get_weights"),
        ("pkg/pipeline/executors/local.py:3", "getattr", "method"),
        ("pkg/pipeline/executors/local.py:6", "getattr", "method"),
    ]
    assert not report.ok


def test_self_and_cls_are_not_counted(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "class C:\n"
        "    def __init__(self, a, b, c, d, e, f, g, h):\n        pass\n"
        "    @classmethod\n"
        "    def make(cls, a, b, c, d, e, f, g, *, h):\n        pass\n"
    )
    report = arch_check.scan(pkg)
    assert report.wide == []
    assert report.ok


def test_wide_limit_needs_reasons_and_at_most_five(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    reason = '    """Over eight parameters: one per symbol."""\n'
    (pkg / "m.py").write_text("".join(f"def f{n}({NINE}):\n{reason}" for n in range(5)))
    assert arch_check.scan(pkg).ok
    (pkg / "n.py").write_text(f"def g({NINE}):\n{reason}")
    assert not arch_check.scan(pkg).ok  # six, all with a reason
    (pkg / "n.py").write_text(f"def g({NINE}):\n    pass\n")
    (pkg / "m.py").write_text("")
    assert not arch_check.scan(pkg).ok  # one, without a reason


@pytest.mark.e2e
def test_cli_exit_status(package: Path, tmp_path: Path):
    run = [sys.executable, str(SCRIPT)]
    loose = subprocess.run([*run, str(package)], capture_output=True, text=True, check=False)
    assert loose.returncode == 0
    assert "FAIL  files over 400 lines: 1 (limit 0)" in loose.stdout
    assert "pkg/lengths.py:2" in loose.stdout
    strict = subprocess.run([*run, "--strict", str(package)], capture_output=True, text=True, check=False)
    assert strict.returncode == 1

    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "m.py").write_text(_function("fits60", 60))
    assert arch_check.main(["--strict", str(clean)]) == 0


def test_the_scripts_folders_are_held_to_the_same_lengths_and_a_test_may_take_many_fixtures(tmp_path: Path):
    tests, results = tmp_path / "tests", tmp_path / "results"
    tests.mkdir()
    results.mkdir()
    (tests / "test_m.py").write_text(
        f"def test_with_nine_fixtures({NINE}):\n    pass\n\n\ndef helper({NINE}):\n    pass\n"
        + CALLS  # stage calls by name: not the scripts' concern
    )
    (results / "big.py").write_text("\n".join(f"x{i} = {i}" for i in range(401)) + "\n")
    (results / "lengths.py").write_text(_function("long61", 61))
    (results / "test_like.py").write_text(f"def test_outside_tests({NINE}):\n    pass\n")
    report = arch_check.scan_folders([results, tests])
    assert [(w.where, w.name) for w in report.wide] == [
        ("results/test_like.py:1", "test_outside_tests"),
        ("tests/test_m.py:5", "helper"),
    ]
    assert [(f.where, f.lines) for f in report.long_files] == [("results/big.py", 401)]
    assert [f.name for f in report.long_functions] == ["long61"]
    assert report.name_calls == []
    assert not report.ok


def test_cli_checks_the_folders_beside_the_package(tmp_path: Path):
    pkg, tests = tmp_path / "pkg", tmp_path / "tests"
    pkg.mkdir()
    tests.mkdir()
    (pkg / "m.py").write_text(_function("fits60", 60))
    (tests / "test_m.py").write_text(_function("long61", 61))
    assert arch_check.main(["--strict", str(pkg)]) == 1
    assert arch_check.main(["--strict", str(pkg), "--folders", "results"]) == 0  # none there
    assert arch_check.main(["--strict", str(pkg), "--folders"]) == 0  # the package alone
