"""ensure_ray starts a local Ray head once more when its GCS server's port file timed out, and only then."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from collapipe_flwr.pipeline.executors import ray_actor  # noqa: E402

TIMEOUT = RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc")


def _fake(monkeypatch, failures: list[BaseException]) -> list[dict]:
    calls: list[dict] = []

    def init(**kwargs):
        calls.append(kwargs)
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    return calls


def test_a_gcs_port_timeout_is_retried_once(monkeypatch):
    calls = _fake(monkeypatch, [TIMEOUT])
    ray_actor.ensure_ray()
    assert len(calls) == 2


def test_a_second_timeout_or_another_error_or_a_cluster_address_propagates(monkeypatch):
    calls = _fake(monkeypatch, [TIMEOUT, TIMEOUT])
    with pytest.raises(RuntimeError, match="Timed out"):
        ray_actor.ensure_ray()
    assert len(calls) == 2
    calls = _fake(monkeypatch, [RuntimeError("something else")])
    with pytest.raises(RuntimeError, match="something else"):
        ray_actor.ensure_ray()
    assert len(calls) == 1
    calls = _fake(monkeypatch, [TIMEOUT])
    with pytest.raises(RuntimeError, match="Timed out"):
        ray_actor.ensure_ray("10.0.0.1:6379")  # joining a cluster: its head is not ours to restart
    assert len(calls) == 1
