"""Counts the comparisons of config option values with string literals (issue 65; standard library only).

    python devtools/option_literals.py [--list] [--limit N] [package_dir]
        (default: collapipe_flwr next to devtools/; the choices are always read from that package)

An option with a fixed set of values is a ``StrEnum`` of the typed config (``class X(StrEnum)`` anywhere in the
package next to devtools/); its members' values are the option values. A comparison ``a == "v"`` /
``a != "v"`` (either side), ``a in ("v", ...)`` / ``not in`` with a literal tuple, list or set, or a ``case
"v":`` pattern, where some ``"v"`` is such a value, counts as a branch on an option's string instead of its
member. Also counted, for context: every ``==`` / ``!=`` against a lowercase string literal (options or not).

The scan reads source only (nothing is imported), so ``package_dir`` may be another checkout (e.g. the tree
before the enums, to count what there was). A value that is also a word of something else counts too, unless what
it is compared with is named as :data:`NOT_OPTIONS` says (``device.type == "cpu"``): ``--list`` prints each hit with
file:line to judge them. With ``--limit N`` the exit
status is 1 when more than N option comparisons are found.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

DEFAULT_PACKAGE = Path(__file__).resolve().parent.parent / "collapipe_flwr"
_LOWER = re.compile(r"[a-z_0-9-]+")
# what is compared is not an option when it is named (variable, attribute, ``.get`` key or method) one of these:
# a torch device's type (``cpu`` | ``cuda``, also an option's words), a frame's or message's kind (``error``), and
# a run-config boolean read from its text (``true`` | ``false``)
NOT_OPTIONS = frozenset({"type", "device_type", "kind", "lower"})


def option_values(package_dir: Path) -> set[str]:
    """The values of every StrEnum member defined in ``package_dir`` (``NAME = "value"`` in the class body)."""
    values: set[str] = set()
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(_base_name(b) == "StrEnum" for b in node.bases):
                for item in node.body:
                    if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                        if isinstance(item.value.value, str):
                            values.add(item.value.value)
    return values


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _name(node: ast.expr) -> str:
    """What ``node`` is called: a name, an attribute, a ``.get("key")`` key or a method called with no argument."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        key = node.args[0] if node.func.attr == "get" and node.args else None
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else node.func.attr
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _literals(node: ast.expr) -> list[str]:
    """The string constants of ``node`` itself or of a literal tuple / list / set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def scan(package_dir: Path, values: set[str]) -> tuple[list[str], int]:
    """(file:line: source of each option comparison, count of every ``==`` / ``!=`` on a lowercase literal)."""
    hits: list[str] = []
    equalities = 0
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        rel = path.relative_to(package_dir.parent)
        for node in ast.walk(ast.parse(text, str(path))):
            found: list[str] = []
            if isinstance(node, ast.Compare):
                lefts = [node.left, *node.comparators[:-1]]
                for op, left, right in zip(node.ops, lefts, node.comparators, strict=True):
                    if _name(left) in NOT_OPTIONS or _name(right) in NOT_OPTIONS:
                        continue
                    if isinstance(op, ast.Eq | ast.NotEq):
                        pair = _literals(left) if isinstance(left, ast.Constant) else []
                        pair += _literals(right) if isinstance(right, ast.Constant) else []
                        equalities += sum(1 for v in pair if _LOWER.fullmatch(v))
                        found += pair
                    elif isinstance(op, ast.In | ast.NotIn):
                        found += _literals(right)
            elif isinstance(node, ast.MatchValue):
                found += _literals(node.value)
            if any(v in values for v in found):
                hits.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return hits, equalities


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", action="store_true", help="print every option comparison with file:line")
    parser.add_argument("--limit", type=int, default=None, help="exit 1 when more option comparisons than this")
    parser.add_argument("package_dir", nargs="?", type=Path, default=DEFAULT_PACKAGE)
    args = parser.parse_args(argv)
    values = option_values(DEFAULT_PACKAGE)
    hits, equalities = scan(args.package_dir, values)
    if args.list:
        print("\n".join(hits))
    print(f"option-value comparisons with string literals: {len(hits)} ({len(values)} option values known)")
    print(f"all == / != comparisons with a lowercase string literal: {equalities}")
    return 1 if args.limit is not None and len(hits) > args.limit else 0


if __name__ == "__main__":
    sys.exit(main())
