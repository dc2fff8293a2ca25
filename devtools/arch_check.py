"""Checks the package's shape against the limits of issue 47, and the scripts' beside it (issue 65; standard library
only).

    python devtools/arch_check.py [--strict] [--folders NAME ...] [package_dir]
        (default: collapipe_flwr next to devtools/; folders: results benchmarks tests beside it, those that exist)

Reports, with file:line:
- functions, methods and constructors with more than 8 parameters (all named ones, keyword-only included,
  ``self``/``cls`` excluded, ``*args`` and ``**kwargs`` one each), and whether the docstring gives the reason:
  a docstring line containing ``Over eight parameters:`` followed by text;
- functions over 60 lines (``def`` line to the end of the body, decorators excluded);
- .py files over 400 lines;
- stage methods called by a name string: ``<x>.call_device(k, "name", ...)`` / ``<x>.submit(k, "name", ...)``,
  and ``getattr(x, <not a string literal>)(...)`` or ``...).remote(...)`` under ``pipeline/executors/`` (a method
  dispatched by a runtime name; a getattr that only reads a value, e.g. a dtype, is not a call).

Limits: at most 5 functions over 8 parameters, each with its reason; no function over 60 lines; no file over
400 lines; no stage method called by name string.

The scripts' folders (results/, benchmarks/, tests/: scripts, not the package) are held to the same limits, counted
together as a second report, but for two: no stage-method check (the scripts drive no stage), and a test function
(``test_*`` under tests/) may take any number of parameters, since pytest hands it its fixtures by parameter name
and grouping them would only hide which fixtures it uses (a helper beside it is held to 8 like any function).
Exit status 0, or with ``--strict`` 1 when a limit of either report is broken.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

MAX_PARAMS = 8
MAX_WIDE_FUNCTIONS = 5
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
REASON_MARKER = "Over eight parameters:"
NAME_CALLS = ("call_device", "submit")
EXECUTORS = ("pipeline", "executors")  # package-relative folder where dynamic getattr counts

DEFAULT_PACKAGE = Path(__file__).resolve().parent.parent / "collapipe_flwr"
SCRIPT_FOLDERS = ("results", "benchmarks", "tests")  # beside the package; held to the same limits (module docstring)
TESTS = "tests"  # where a test function's parameters are its fixtures


@dataclass(frozen=True)
class WideFunction:
    where: str
    name: str
    params: int
    reason: str  # "" when the docstring gives none


@dataclass(frozen=True)
class LongFunction:
    where: str
    name: str
    lines: int


@dataclass(frozen=True)
class LongFile:
    where: str
    lines: int


@dataclass(frozen=True)
class NameCall:
    where: str
    kind: str  # "call_device", "submit" or "getattr"
    name: str  # the string literal, or the source of the dynamic name


@dataclass
class Report:
    wide: list[WideFunction] = field(default_factory=list)
    long_functions: list[LongFunction] = field(default_factory=list)
    long_files: list[LongFile] = field(default_factory=list)
    name_calls: list[NameCall] = field(default_factory=list)

    def verdicts(self) -> list[tuple[bool, str]]:
        """(ok, line) per limit."""
        unexplained = sum(1 for w in self.wide if not w.reason)
        wide_ok = len(self.wide) <= MAX_WIDE_FUNCTIONS and unexplained == 0
        return [
            (
                wide_ok,
                f"functions over {MAX_PARAMS} parameters: {len(self.wide)} (limit {MAX_WIDE_FUNCTIONS}), "
                f"{unexplained} without a reason",
            ),
            (
                not self.long_functions,
                f"functions over {MAX_FUNCTION_LINES} lines: {len(self.long_functions)} (limit 0)",
            ),
            (not self.long_files, f"files over {MAX_FILE_LINES} lines: {len(self.long_files)} (limit 0)"),
            (not self.name_calls, f"stage methods called by name string: {len(self.name_calls)} (limit 0)"),
        ]

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.verdicts())


def count_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    named = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    n = sum(1 for name in named if name not in ("self", "cls"))
    return n + (a.vararg is not None) + (a.kwarg is not None)


def stated_reason(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The text after ``Over eight parameters:`` on a docstring line, or ""."""
    for line in (ast.get_docstring(fn) or "").splitlines():
        _, marker, rest = line.partition(REASON_MARKER)
        if marker and rest.strip():
            return rest.strip()
    return ""


def _qualified_functions(tree: ast.Module):
    """(qualified name, node) of every function and method, nested ones included."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                stack.append((f"{name}.", child))
            else:
                stack.append((prefix, child))


def _name_calls(tree: ast.Module, rel: str, in_executors: bool) -> list[NameCall]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in NAME_CALLS and len(node.args) >= 2:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(NameCall(f"{rel}:{node.lineno}", func.attr, arg.value))
        elif in_executors:
            target = func.value if isinstance(func, ast.Attribute) and func.attr == "remote" else func
            name = _dynamic_getattr(target)
            if name:
                found.append(NameCall(f"{rel}:{node.lineno}", "getattr", name))
    return found


def _dynamic_getattr(node: ast.expr) -> str:
    """The name expression of ``getattr(x, <not a string literal>)`` when ``node`` is one (a method looked up by a
    runtime name and then called, directly or through Ray's ``.remote``), else ""."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"):
        return ""
    if len(node.args) < 2:
        return ""
    arg = node.args[1]
    return "" if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ast.unparse(arg)


def scan(package_dir: Path) -> Report:
    """The package's findings: every limit, the stage-method check included."""
    package_dir = Path(package_dir)
    report = Report()
    for path in sorted(package_dir.rglob("*.py")):
        tree = _check_file(path, package_dir.parent, report, fixtures_as_params=False)
        rel_parts = path.relative_to(package_dir).parts
        in_executors = rel_parts[: len(EXECUTORS)] == EXECUTORS
        report.name_calls.extend(_name_calls(tree, path.relative_to(package_dir.parent).as_posix(), in_executors))
    _sort(report)
    return report


def scan_folders(folders: list[Path]) -> Report:
    """The scripts' findings over ``folders`` together (each named from its parent): the lengths and the parameter
    limit, a test function's fixtures not counted (module docstring); no stage-method check."""
    report = Report()
    for folder in map(Path, folders):
        for path in sorted(folder.rglob("*.py")):
            _check_file(path, folder.parent, report, fixtures_as_params=folder.name == TESTS)
    _sort(report)
    return report


def _check_file(path: Path, base: Path, report: Report, fixtures_as_params: bool) -> ast.Module:
    """Add ``path``'s long file, long functions and wide functions to ``report`` (named from ``base``); a
    ``test_*`` function's parameters are not counted when ``fixtures_as_params``. Returns its syntax tree."""
    rel = path.relative_to(base).as_posix()
    source = path.read_text(encoding="utf-8")
    n_lines = len(source.splitlines())
    if n_lines > MAX_FILE_LINES:
        report.long_files.append(LongFile(rel, n_lines))
    tree = ast.parse(source, filename=str(path))
    for name, fn in _qualified_functions(tree):
        where = f"{rel}:{fn.lineno}"
        params = count_params(fn)
        if params > MAX_PARAMS and not (fixtures_as_params and fn.name.startswith("test_")):
            report.wide.append(WideFunction(where, name, params, stated_reason(fn)))
        length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if length > MAX_FUNCTION_LINES:
            report.long_functions.append(LongFunction(where, name, length))
    return tree


def _sort(report: Report) -> None:
    for items in (report.wide, report.long_functions, report.name_calls):
        items.sort(key=lambda item: _where_key(item.where))


def _where_key(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    if not rows:
        return f"{title}: none"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [f"{title}: {len(rows)}", fmt.format(*header).rstrip()]
    lines += [fmt.format(*r).rstrip() for r in rows]
    return "\n".join(lines)


def render(report: Report, scripts: bool = False) -> str:
    """The report as tables and verdicts; ``scripts``: the scripts' report (no stage-method check)."""
    parts = [
        _table(
            f"Functions over {MAX_PARAMS} parameters",
            ("where", "function", "params", "reason"),
            [(w.where, w.name, str(w.params), w.reason or "-- none --") for w in report.wide],
        ),
        _table(
            f"Functions over {MAX_FUNCTION_LINES} lines",
            ("where", "function", "lines"),
            [(f.where, f.name, str(f.lines)) for f in report.long_functions],
        ),
        _table(
            f"Files over {MAX_FILE_LINES} lines",
            ("file", "lines"),
            [(f.where, str(f.lines)) for f in report.long_files],
        ),
    ]
    verdicts = report.verdicts()
    if not scripts:
        parts.append(
            _table(
                "Stage methods called by name string",
                ("where", "call", "name"),
                [(c.where, c.kind, c.name) for c in report.name_calls],
            )
        )
    else:
        verdicts = verdicts[:-1]  # no stage-method check
    parts.append("Verdicts:\n" + "\n".join(f"  {'OK  ' if ok else 'FAIL'}  {line}" for ok, line in verdicts))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--strict", action="store_true", help="exit 1 when any limit is broken")
    parser.add_argument(
        "--folders",
        nargs="*",
        default=list(SCRIPT_FOLDERS),
        help="the scripts' folders beside the package held to the same limits (default: results benchmarks tests; "
        "those that exist); none: the package alone",
    )
    parser.add_argument("package_dir", nargs="?", type=Path, default=DEFAULT_PACKAGE)
    args = parser.parse_args(argv)
    if not args.package_dir.is_dir():
        parser.error(f"not a folder: {args.package_dir}")
    report = scan(args.package_dir)
    print(render(report))
    ok = report.ok
    folders = [args.package_dir.parent / name for name in args.folders if (args.package_dir.parent / name).is_dir()]
    if folders:
        scripts = scan_folders(folders)
        names = ", ".join(f"{folder.name}/" for folder in folders)
        print(f"\n\n# The scripts beside the package: {names}\n")
        print(render(scripts, scripts=True))
        ok = ok and scripts.ok
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
