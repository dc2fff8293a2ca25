"""A whole federated round with the data plane over TLS: the certificate files named in the config, the CU
trusting the certificate its train message carried (tests/tls_certs.py makes it; nothing is downloaded)."""

from __future__ import annotations

import json

import pytest

from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid
from tests.tls_certs import self_signed

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("transport", ["grpc", "socket"])
def test_a_round_over_a_tls_data_plane(data_dir, tmp_path, transport):
    cert, key = self_signed(tmp_path / "tls")
    overrides = (
        "task=classification model=bert_tiny federation=tiny network=small federation.num_rounds=1 "
        "federation.local_steps=2 runtime.backend=local task.batch_size=8 eval.max_examples=16 run_name=tls "
        f"dataplane.tls_cert={cert} dataplane.tls_key={key} dataplane.transport={transport}"
    )
    folder = run_server(
        InProcessGrid(2, str(data_dir), run_id=41),
        {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)},
    )
    last = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()][-1]
    assert last["failures"] == [] and sorted(last["clients"]) == ["0", "1"]
    assert all(c["steps"] == 2 for c in last["clients"].values())
