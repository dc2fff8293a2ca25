"""Every size ``checkpoint.pt`` claims is bounded before anything of that size is allocated (issue 67).

A crafted checkpoint used to get through ``torch.load(weights_only=True)`` (it runs no code) and then make the
ServerApp allocate what it claimed: a decoder ``exp_avg`` of one float64 expanded (stride 0) to 2^32 elements
made Adam's ``load_state_dict`` allocate 16 GiB, a sparse tensor or a compressed record (a zip bomb) likewise,
and ``round`` = -3, 1.5 or True went through. Now the file is mapped (never read into memory) and refused in
one line naming it and the tensor, whichever path loads it: the launcher's pre-check (``load_checkpoint``) and
the ServerApp's own resume (``restore``, which also holds every tensor to this run's model's shapes).
"""

from __future__ import annotations

import copy
import zipfile
from pathlib import Path

import pytest
import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.checkpoint import CHECKPOINT_FILE, FORMAT, capture, load_checkpoint, restore

BIG = 2**32  # 16 GiB as float32, 32 GiB as float64: never allocated by these tests


def _one_line(err: BaseException) -> str:
    message = str(err)
    assert "\n" not in message and message
    return message


def _payload(**changes) -> dict:
    """A checkpoint payload with every key, empty parts; ``changes`` replace keys."""
    payload = {
        "format": FORMAT,
        "round": 1,
        "model": {"embedding": {}, "encoder": {}, "head": {}},
        "cluster_parts": {},
        "server_optimizer": {"name": "fedavg", "layout": None},
        "decoder_optimizer": None,
        "policy": {},
        "rng": {},
    }
    return {**payload, **changes}


def _adam_state(**moments) -> dict:
    return {"state": {0: {"step": torch.tensor(3.0), **moments}}, "param_groups": [{"lr": 1e-3, "params": [0]}]}


def _refused(folder: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_checkpoint(folder)
    message = _one_line(info.value)
    assert str(folder / CHECKPOINT_FILE) in message and "afresh" in message, message
    return message


def test_an_expanded_tensor_is_refused_without_allocating_it(tmp_path):
    """One float64 expanded to 2^32 elements: 8 bytes on disk, 32 GiB once Adam's load_state_dict copies it."""
    expanded = torch.zeros((), dtype=torch.float64).expand(BIG)
    torch.save(_payload(decoder_optimizer=_adam_state(exp_avg=expanded)), tmp_path / CHECKPOINT_FILE)
    assert (tmp_path / CHECKPOINT_FILE).stat().st_size < 1 << 20
    message = _refused(tmp_path)
    assert "decoder_optimizer.state.0.exp_avg" in message and "expanded" in message, message


def test_a_sparse_tensor_is_refused(tmp_path):
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, BIG - 1]]), torch.tensor([1.0, 2.0]), (BIG,))
    torch.save(_payload(decoder_optimizer=_adam_state(exp_avg_sq=sparse)), tmp_path / CHECKPOINT_FILE)
    message = _refused(tmp_path)
    assert "decoder_optimizer.state.0.exp_avg_sq" in message and "sparse" in message, message


def test_a_compressed_record_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path):
    """torch.save stores its records uncompressed; a deflated one (a zip bomb: a few KB that inflate to GBs)
    is refused from the archive's directory, before torch reads it."""
    plain = tmp_path / "plain.pt"
    torch.save(_payload(rng={"torch": torch.zeros(1 << 20, dtype=torch.uint8)}), plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(tmp_path / CHECKPOINT_FILE, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    assert (tmp_path / CHECKPOINT_FILE).stat().st_size < 1 << 16  # 1 MiB of zeros in a few KB
    message = _refused(tmp_path)
    assert "compressed" in message, message


def test_a_record_larger_than_the_file_is_refused(tmp_path):
    """The archive's directory says a record holds 4 GiB: more than the whole file, so it is not believed."""
    path = tmp_path / CHECKPOINT_FILE
    torch.save(_payload(rng={"torch": torch.zeros(64, dtype=torch.uint8)}), path)
    body = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        names = [i.filename for i in zf.infolist()]
    record = next(n for n in names if n.endswith("data/0")).encode()
    at = next(i for i in _all(body, b"PK\x01\x02") if body[i + 46 : i + 46 + len(record)] == record)
    body[at + 24 : at + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # the central directory's uncompressed size
    path.write_bytes(bytes(body))
    message = _refused(tmp_path)
    assert "data/0" in message and "larger than the file" in message, message


def _all(body: bytes | bytearray, needle: bytes) -> list[int]:
    found, at = [], body.find(needle)
    while at >= 0:
        found.append(at)
        at = body.find(needle, at + 1)
    return found


@pytest.mark.parametrize("value", [-3, 1.5, True, "2", None, 2**70])
def test_a_round_that_is_not_a_non_negative_int_is_refused(tmp_path, value):
    torch.save(_payload(round=value), tmp_path / CHECKPOINT_FILE)
    message = _refused(tmp_path)
    assert f"round {value!r}" in message and "not a round number" in message, message


# ----------------------------------------------------------------------------- against this run's model
@pytest.fixture(scope="module")
def server(data_dir, tmp_path_factory):
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.fl.server.server_state import ServerState

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLAPIPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        overrides = [
            "task=translation", "model=transformer_tiny", "federation=tiny", "network=small",
            "runtime.backend=local", "runtime.precision=fp32", "clock.host_flops=1e9",
        ]  # fmt: skip
        state = ServerState.build(load_run_config(overrides, data_dir=str(data_dir)))
        yield state
        state.shutdown()


def _decoder_params(server) -> list[torch.Tensor]:
    return [p for group in server.decoder.host.optimizer.param_groups for p in group["params"]]


def _saved(server, folder: Path, edit) -> Path:
    payload = copy.deepcopy(capture(server, 1))  # capture shares the server's own dicts: edit a copy
    edit(payload)
    torch.save(payload, folder / CHECKPOINT_FILE)
    return folder / CHECKPOINT_FILE


def test_a_checkpoint_of_this_runs_model_restores(server, tmp_path):
    shape = tuple(_decoder_params(server)[0].shape)

    def moments(payload):
        payload["decoder_optimizer"]["state"] = {0: {"step": torch.tensor(2.0), "exp_avg": torch.ones(shape)}}

    _saved(server, tmp_path, moments)
    assert restore(server, load_checkpoint(tmp_path), tmp_path / CHECKPOINT_FILE) == 1
    assert torch.equal(server.decoder.host.optimizer.state_dict()["state"][0]["exp_avg"], torch.ones(shape))
    server.decoder.host.optimizer.state.clear()


def _head_weight(payload) -> str:
    return next(k for k, v in payload["model"]["head"].items() if v.dim() == 2)


EDITS = {
    "a decoder moment of another shape": (
        lambda p, s: p["decoder_optimizer"].__setitem__("state", {0: {"exp_avg": torch.zeros(3, 7)}}),
        "decoder_optimizer.state.0.exp_avg",
    ),
    "a decoder moment of a parameter the head lacks": (
        lambda p, s: p["decoder_optimizer"].__setitem__("state", {999: {"exp_avg": torch.zeros(1)}}),
        "decoder_optimizer.state.999",
    ),
    "a model tensor of another shape": (
        lambda p, s: p["model"]["head"].__setitem__(_head_weight(p), torch.zeros(4, 4)),
        "model.head.",
    ),
    "a model tensor the model lacks": (
        lambda p, s: p["model"]["encoder"].__setitem__("extra.weight", torch.zeros(2)),
        "model.encoder.extra.weight",
    ),
    "a torch random state of another size": (
        lambda p, s: p["rng"].__setitem__("torch", torch.zeros(1 << 20, dtype=torch.uint8)),
        "rng.torch",
    ),
    "a server optimizer moment without a layout": (
        lambda p, s: p["server_optimizer"].__setitem__("momentum_vector", [torch.zeros(1 << 20)]),
        "server_optimizer.momentum_vector",
    ),
    "a cluster's part of another shape": (
        lambda p, s: p["cluster_parts"].__setitem__(0, {"head": {_head_weight(p): torch.zeros(5, 5)}}),
        "cluster_parts.0.head.",
    ),
    "a tensor where none belongs": (
        lambda p, s: p["policy"].__setitem__("Y", torch.zeros(3)),
        "policy.Y",
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_tensor_that_does_not_fit_this_runs_model_is_refused_naming_it(server, tmp_path, edit):
    change, names = EDITS[edit]
    path = _saved(server, tmp_path, lambda p: change(p, server))
    with pytest.raises(ConfigError) as info:
        restore(server, load_checkpoint(tmp_path), path)
    message = _one_line(info.value)
    assert str(path) in message and names in message and "afresh" in message, message
    assert not server.decoder.host.optimizer.state  # nothing of it was loaded


@pytest.mark.e2e
def test_the_serverapps_own_resume_refuses_an_expanded_moment(data_dir, tmp_path, capsys):
    """`flwr run` with resume=true (the deployment path, no launcher pre-check): the ServerApp's own load
    refuses a decoder moment of the head's shape whose storage is one number (stride 0)."""
    from collapipe_flwr.fl.server.server_main import run_server
    from tests.fl.server.test_resume import _DyingGrid, _ServerKilled
    from tests.inprocess_grid import InProcessGrid

    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
        "federation.local_steps=1 federation.optimizer_state=reset runtime.backend=local runtime.precision=fp32 "
        "task.batch_size=8 eval.max_examples=8 model.dropout=0.0 run_name=r"
    )
    config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    with pytest.raises(_ServerKilled):  # round 1 complete and checkpointed
        run_server(_DyingGrid(2, str(data_dir), run_id=81, die_at=2), config)
    checkpoint = tmp_path / "r" / CHECKPOINT_FILE
    payload = torch.load(checkpoint, weights_only=True)
    state = payload["decoder_optimizer"]["state"]
    index, moments = next(iter(state.items()))
    moments["exp_avg"] = torch.zeros((), dtype=torch.float64).expand(moments["exp_avg"].shape)
    torch.save(payload, checkpoint)
    capsys.readouterr()
    with pytest.raises(ConfigError):
        run_server(InProcessGrid(2, str(data_dir), run_id=82), {**config, "overrides": overrides + " resume=true"})
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and str(checkpoint) in err, err
    assert f"decoder_optimizer.state.{index}.exp_avg" in err and "expanded" in err, err


def test_a_bert_folders_expanded_or_compressed_weights_are_refused(tmp_path):
    """The other weights_only loader: a local BERT folder's pytorch_model.bin (models/bert.py) is mapped and
    bounded the same way, before the shapes are compared with the model's."""
    from collapipe_flwr.models.bert import read_checkpoint

    weights = tmp_path / "pytorch_model.bin"
    torch.save({"embeddings.word_embeddings.weight": torch.zeros((), dtype=torch.float64).expand(BIG, 768)}, weights)
    with pytest.raises(ConfigError) as info:
        read_checkpoint(tmp_path)
    message = _one_line(info.value)
    assert str(weights) in message and "embeddings.word_embeddings.weight" in message and "expanded" in message
    assert "re-download" in message

    plain = {"embeddings.LayerNorm.gamma": torch.ones(4)}
    torch.save(plain, weights)
    assert set(read_checkpoint(tmp_path)) == {"embeddings.LayerNorm.weight"}  # a sound file still loads
    with zipfile.ZipFile(tmp_path / "plain.zip", "w") as dst, zipfile.ZipFile(weights) as src:
        for record in src.infolist():
            dst.writestr(record.filename, src.read(record), compress_type=zipfile.ZIP_DEFLATED)
    (tmp_path / "plain.zip").replace(weights)
    with pytest.raises(ConfigError, match="compressed.*re-download the checkpoint"):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize("name", ["fedavgm", "fedadam"])
def test_a_checkpoint_with_cluster_parts_and_server_moments_restores(server, tmp_path, monkeypatch, name):
    """What the checks must let through: clusters' own parts (methods without aggregation) and the server
    optimizer's moments (FedAvgM's list, FedAdam's dicts) of this model's layout."""
    from collapipe_flwr.fl.server.aggregation.global_model import flatten_parts
    from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer

    model = server.global_model
    optimizer = ServerOptimizer(name, lr=0.5, momentum=0.9)
    current = flatten_parts(model.returned_parts())
    moved = {k: v + 0.01 if v.is_floating_point() else v for k, v in current.items()}
    optimizer.step(1, current, [(moved, 4.0)])
    monkeypatch.setattr(model, "server_optimizer", optimizer)
    monkeypatch.setattr(model, "cluster_parts", {1: copy.deepcopy(model.returned_parts())})
    torch.save(capture(server, 2), tmp_path / CHECKPOINT_FILE)
    fresh = ServerOptimizer(name, lr=0.5, momentum=0.9)
    monkeypatch.setattr(model, "server_optimizer", fresh)
    monkeypatch.setattr(model, "cluster_parts", {})
    assert restore(server, load_checkpoint(tmp_path), tmp_path / CHECKPOINT_FILE) == 2
    assert fresh._layout == optimizer._layout and set(model.cluster_parts) == {1}
