"""The staged app folder gives Flower's own FAB builder the same FAB as the project root (the reference)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from collapipe_flwr.experiments.app_files import app_files, stage_app
from collapipe_flwr.experiments.launch import PROJECT_ROOT


def members(fab: bytes) -> dict[str, bytes]:
    archive = zipfile.ZipFile(io.BytesIO(fab))
    return {name: archive.read(name) for name in archive.namelist()}


def test_the_staged_app_builds_the_projects_fab_byte_for_byte(tmp_path):
    staged = stage_app(PROJECT_ROOT, tmp_path / "app")
    assert members(build_fab_from_disk(staged)) == members(build_fab_from_disk(PROJECT_ROOT))


def make_project(root: Path) -> Path:
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "proj"\nversion = "1.0.0"\ndependencies = []\n\n'
        '[tool.flwr.app]\npublisher = "test"\nfab-include = ["app.py", "pkg/**/*.py", "README.md"]\n\n'
        '[tool.flwr.app.components]\nserverapp = "app:server"\nclientapp = "app:client"\n\n'
        "[tool.flwr.app.config]\n",
        encoding="utf-8",
    )
    (root / ".gitignore").write_text("/big/\n*.log\n")
    for rel in (
        "app.py",
        "pkg/a.py",
        "pkg/sub/b.py",
        "README.md",
        "docs/README.md",
        "pkg/notes.txt",
        "big/pkg/huge.py",
        ".venv/pkg/x.py",
        "pkg/run.log",
        "pkg/__pycache__/a.py",
    ):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    return root


def test_ignored_hidden_and_cache_folders_are_not_entered_and_patterns_match_like_git(tmp_path):
    root = make_project(tmp_path / "proj")
    # "README.md" has no slash: git-wildmatch matches it at any depth, as Flower's builder does
    assert app_files(root) == ["README.md", "app.py", "docs/README.md", "pkg/a.py", "pkg/sub/b.py"]
    assert members(build_fab_from_disk(stage_app(root, tmp_path / "staged"))) == members(build_fab_from_disk(root))


def test_a_project_without_fab_include_is_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(ValueError, match="sets no \\[tool.flwr.app\\] fab-include"):
        app_files(tmp_path)
