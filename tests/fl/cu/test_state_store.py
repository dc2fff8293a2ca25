"""One CU state store per process (fl/cu/state_store.py) and one interface for the moments (fl/cu/moments.py).

- Two stores in one process are two processes' state: neither sees the other's task or sessions, and dropping a
  session in one leaves the other's.
- No module of the CU (fl/cu/, client_app.py) holds a mutable container at module level: the store owns what a
  CU process keeps.
- The moment stores: Flower's ``Context.state`` gives back only this run's moments of an earlier round; the disk
  is the CU checkpoint file; a round restores from ``Context.state`` first, then from the disk.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from flwr.app import RecordDict

from collapipe_flwr.fl.cu.cu_checkpoint import state_path
from collapipe_flwr.fl.cu.moments import ContextMoments, DiskMoments, round_moments
from collapipe_flwr.fl.cu.state_store import CUStateStore
from tests.fl.cu.test_cluster_session import _bert_tiny_cfg
from tests.paths import ROOT


def _cluster_config(data_dir):
    """One cluster of bert_tiny classification on the in-process backend (test_cluster_session's config)."""
    return _bert_tiny_cfg(data_dir).cluster_config().with_data_dir(str(data_dir))


def test_two_stores_in_one_process_share_nothing(data_dir):
    ccfg = _cluster_config(data_dir)
    first, second = CUStateStore(), CUStateStore()
    session = first.session_for("run-a", 0, 1, ccfg)
    assert first.session_for("run-a", 0, 1, ccfg) is session  # the same process keeps its session
    assert first.existing_session("run-a", 0) is session and first.cached_task(ccfg) is session.task
    assert second.existing_session("run-a", 0) is None  # another process has none of it
    other = second.session_for("run-a", 0, 1, ccfg)
    assert other is not session and other.model is not session.model and other.task is not session.task
    assert second.cached_task(ccfg) is other.task
    assert second.drop_session("run-a", 0, 0) == 0  # no device actors on the local backend
    assert second.existing_session("run-a", 0) is None
    assert first.existing_session("run-a", 0) is session  # untouched by the other store's release


_CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
_CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary"}


def _mutable_globals(path: Path) -> list[str]:
    """``file:line`` of each module-level assignment of a mutable container in ``path``."""
    found = []
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        call = (
            isinstance(value, ast.Call)
            and getattr(value.func, "id", getattr(value.func, "attr", "")) in _CONTAINER_CALLS
        )
        if isinstance(value, _CONTAINERS) or call:
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_global_holds_cu_state():
    root = ROOT
    modules = [*sorted((root / "collapipe_flwr" / "fl" / "cu").glob("*.py")), root / "client_app.py"]
    assert len(modules) > 10
    assert [where for path in modules for where in _mutable_globals(path)] == []


def test_context_moments_give_back_only_this_runs_earlier_rounds():
    state = RecordDict()
    saved = {"embedding|weight|exp_avg": torch.arange(6.0).reshape(2, 3)}
    ContextMoments(state, "run-a").save(3, saved)
    saved["embedding|weight|exp_avg"].zero_()  # stored at once: a later optimizer step changes nothing
    loaded = ContextMoments(state, "run-a").load(before_round=4)
    assert loaded is not None
    torch.testing.assert_close(loaded["embedding|weight|exp_avg"], torch.arange(6.0).reshape(2, 3))
    assert ContextMoments(state, "run-b").load(before_round=4) is None  # another run's
    assert ContextMoments(state, "run-a").load(before_round=3) is None  # not an earlier round's
    assert ContextMoments(RecordDict(), "run-a").load(before_round=4) is None  # none kept


def test_disk_moments_are_the_cu_checkpoint_and_rounds_restore_context_first(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAPIPE_CU_STATE_DIR", str(tmp_path / "cu-state"))
    disk = DiskMoments("abc123", 1)
    disk.save(2, {"head|w|exp_avg_sq": torch.ones(4)})
    assert state_path("abc123", 1).exists()
    loaded = disk.load(before_round=3)
    assert loaded is not None and torch.equal(loaded["head|w|exp_avg_sq"], torch.ones(4))
    assert disk.load(before_round=2) is None
    state = RecordDict()
    stores = round_moments(state, "run-a", 1, "abc123")
    assert [type(s) for s in stores] == [ContextMoments, DiskMoments]
    assert [s.with_devices for s in stores] == [False, True]  # the disk keeps the device actors' moments too
    assert round_moments(None, "run-a", 1, "") == ()  # no Context.state, no checkpoint: nowhere
    disk.discard()
    assert not state_path("abc123", 1).exists()
