"""The Flower app's own files, staged in a folder of their own before ``flwr run`` builds the FAB from it.

``flwr run <project>`` builds its FAB by walking the whole project folder and resolving every file
(``flwr.cli.utils.collect_files``: ``os.walk`` + ``Path.resolve`` per file) before it applies the
``fab-include`` patterns. A virtual environment inside the project (``.venv/``, tens of thousands of files)
makes that take 4-8 s on a 2-core machine, on every run and every sweep job. :func:`stage_app` walks the
project once with the ignored and hidden folders pruned, copies the files ``[tool.flwr.app] fab-include``
names (matched with pathspec's git-wildmatch, the library and pattern style Flower uses) plus
``pyproject.toml`` and ``.gitignore`` into ``dest``, and returns it: Flower then builds the same app from a
folder that holds nothing else. Nothing here replaces Flower's own include/exclude rules, which still apply
when it builds from the staged folder.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pathspec

ALWAYS = ("pyproject.toml", ".gitignore")
PRUNED = ("__pycache__", "node_modules")


def fab_include_patterns(project_root: Path) -> list[str] | None:
    """``[tool.flwr.app] fab-include`` of the project's pyproject.toml (None when it sets none)."""
    with (project_root / "pyproject.toml").open("rb") as fh:
        config = tomllib.load(fh)
    patterns = config.get("tool", {}).get("flwr", {}).get("app", {}).get("fab-include")
    return [str(p) for p in patterns] if patterns else None


def app_files(project_root: Path) -> list[str]:
    """Project-relative POSIX paths of the app's files: what ``fab-include`` selects among the files that are
    not git-ignored, outside hidden, ignored and cache folders (which are never entered)."""
    patterns = fab_include_patterns(project_root)
    if patterns is None:
        raise ValueError(f"{project_root / 'pyproject.toml'} sets no [tool.flwr.app] fab-include")
    include = pathspec.PathSpec.from_lines("gitwildmatch", patterns)
    gitignore = project_root / ".gitignore"
    ignored = pathspec.PathSpec.from_lines(
        "gitwildmatch", gitignore.read_text().splitlines() if gitignore.is_file() else []
    )
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(project_root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(project_root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and d not in PRUNED
            and not os.path.islink(os.path.join(dirpath, d))
            and not ignored.match_file(prefix + d + "/")
        )
        for name in sorted(filenames):
            rel = prefix + name
            if os.path.islink(os.path.join(dirpath, name)) or ignored.match_file(rel):
                continue
            if include.match_file(rel):
                found.append(rel)
    return found


def stage_app(project_root: Path, dest: Path) -> Path:
    """Copy the app's files (:func:`app_files`) and pyproject.toml / .gitignore into ``dest``; return ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in [*(name for name in ALWAYS if (project_root / name).is_file()), *app_files(project_root)]:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project_root / rel, target)
    return dest
