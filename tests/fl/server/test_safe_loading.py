"""Every file a run reads back is loaded without running code from it, and a damaged one is one line naming it.

- the server's ``checkpoint.pt`` (fl/server/checkpoint.py): tensors and plain values only, read with
  ``torch.load(weights_only=True)``; a pickle that would run code, a text file, a truncated file or a checkpoint
  of the old format 1 is a one-line ConfigError, and a resume with one is refused;
- a CU's optimizer moments (fl/cu/cu_checkpoint.py): safetensors with its run key, cluster, round and a SHA-256;
  a file that exists but cannot be used is a one-line CUStateError naming it (the CU's round fails with it),
  and a symbolically linked key folder or file is never followed.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.cu.cu_checkpoint import (
    STATE_DIR_ENV,
    CUStateError,
    load_cu_state,
    remove_cu_state,
    save_cu_state,
    state_path,
)
from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.server.checkpoint import (
    CHECKPOINT_FILE,
    FORMAT,
    load_checkpoint,
    load_numpy_rng_state,
    load_server_optimizer_state,
    numpy_rng_state,
    server_optimizer_state,
)


class _RunsCode:
    """What a hostile checkpoint holds: unpickling it calls exec, which writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _one_line(err: BaseException) -> str:
    message = str(err)
    assert "\n" not in message and message
    return message


# ----------------------------------------------------------------------------- the server's checkpoint.pt
@pytest.mark.parametrize("writer", ["torch.save", "pickle protocol 2", "pickle protocol 4"])
def test_a_checkpoint_whose_pickle_would_run_code_is_refused_without_running_it(tmp_path, writer):
    path = tmp_path / CHECKPOINT_FILE
    payload = {"format": FORMAT, "round": 3, "model": _RunsCode(tmp_path / "marker")}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with path.open("wb") as fh:
            pickle.dump(payload, fh, protocol=int(writer[-1]))
    with pytest.raises(ConfigError) as info:
        load_checkpoint(tmp_path)
    message = _one_line(info.value)
    assert str(path) in message and "afresh" in message
    if writer == "torch.save":
        assert "calls exec" in message and "run code" in message  # torch names a builtin without its module
    else:  # a bare pickle is not even handed to the (restricted) unpickler
        assert "not a torch.save archive" in message
    with pytest.raises(ConfigError):
        load_checkpoint(tmp_path)  # the cheap check a launcher makes before the run (the tensors are mapped)
    assert not (tmp_path / "marker").exists()

    # the premise: the unrestricted loader would have run it
    torch.load(path, weights_only=False) if writer == "torch.save" else pickle.loads(path.read_bytes())
    assert (tmp_path / "marker").read_text() == "ran"


@pytest.mark.parametrize("damage", ["text", "empty", "truncated", "zeros"])
def test_a_damaged_checkpoint_is_one_line_naming_it(tmp_path, damage):
    path = tmp_path / CHECKPOINT_FILE
    torch.save({"format": FORMAT, "round": 1, "weights": torch.randn(4096)}, path)
    body = path.read_bytes()
    path.write_bytes(
        {"text": b"round 3 was fine\n", "empty": b"", "truncated": body[: len(body) // 2], "zeros": bytes(4096)}[damage]
    )
    with pytest.raises(ConfigError) as info:
        load_checkpoint(tmp_path)
    message = _one_line(info.value)
    assert str(path) in message and "afresh" in message and "weights_only" not in message


def test_a_checkpoint_of_the_old_format_is_refused_saying_so(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    # format 1 pickled the server optimizer object itself, and np.random.get_state()'s array
    torch.save({"format": 1, "round": 2, "server_optimizer": ServerOptimizer("fedadam")}, path)
    with pytest.raises(ConfigError) as info:
        load_checkpoint(tmp_path)
    message = _one_line(info.value)
    assert str(path) in message and "format 1" in message and f"format {FORMAT} only" in message

    keys = ("model", "cluster_parts", "server_optimizer", "decoder_optimizer", "policy", "rng")
    torch.save({"format": 1, "round": 2, **dict.fromkeys(keys)}, path)  # loadable, but not this format
    with pytest.raises(ConfigError) as info:
        load_checkpoint(tmp_path)
    assert "format 1" in _one_line(info.value) and str(path) in str(info.value)


def test_a_missing_checkpoint_and_a_foreign_payload_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_checkpoint(tmp_path)
    torch.save({"weights": torch.ones(2)}, tmp_path / CHECKPOINT_FILE)  # safe to load, not a checkpoint
    with pytest.raises(ConfigError, match="not a CollaPipe checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_the_server_optimizer_state_survives_a_weights_only_round_trip_exactly(tmp_path, name):
    gen = torch.Generator().manual_seed(0)
    current = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen), "n": torch.tensor(5)}

    def clients():
        return [({k: v + 0.1 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                  for k, v in current.items()}, 8.0) for _ in range(2)]  # fmt: skip

    first = ServerOptimizer(name, lr=0.5, momentum=0.9)
    for t in (1, 2):
        current = first.step(t, current, clients())
    torch.save({"server_optimizer": server_optimizer_state(first)}, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)["server_optimizer"]
    resumed = ServerOptimizer(name, lr=0.5, momentum=0.9)
    load_server_optimizer_state(resumed, state)
    results = clients()
    want, got = first.step(3, current, results), resumed.step(3, current, results)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    with pytest.raises(ConfigError, match="server optimizer"):
        load_server_optimizer_state(ServerOptimizer("fedavg" if name != "fedavg" else "fedadam"), state)


@pytest.mark.parametrize("odd_draws", [0, 1])
def test_the_numpy_random_state_survives_a_weights_only_round_trip(tmp_path, odd_draws):
    np.random.seed(3)
    np.random.standard_normal(odd_draws)  # an odd number of normal draws leaves a cached gaussian
    torch.save(numpy_rng_state(), tmp_path / "rng.pt")
    want = np.random.standard_normal(5), np.random.randint(0, 1 << 30, 5)
    load_numpy_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = np.random.standard_normal(5), np.random.randint(0, 1 << 30, 5)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.e2e
def test_a_resume_with_a_hostile_checkpoint_is_refused_before_anything_runs(data_dir, tmp_path, capsys):
    """The ServerApp's own path (run_server): a ConfigError with its one line on stderr, the code never run."""
    from collapipe_flwr.fl.server.server_main import run_server
    from tests.fl.server.test_resume import _DyingGrid, _ServerKilled
    from tests.inprocess_grid import InProcessGrid

    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
        "federation.local_steps=1 federation.optimizer_state=reset runtime.backend=local runtime.precision=fp32 "
        "task.batch_size=8 eval.max_examples=8 model.dropout=0.0 run_name=r"
    )
    config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    with pytest.raises(_ServerKilled):  # round 1 complete and checkpointed, round 2 never was
        run_server(_DyingGrid(2, str(data_dir), run_id=61, die_at=2), config)
    checkpoint = tmp_path / "r" / CHECKPOINT_FILE
    torch.save({"format": FORMAT, "round": 1, "model": _RunsCode(tmp_path / "marker")}, checkpoint)
    capsys.readouterr()
    with pytest.raises(ConfigError):  # raised on to Flower, which records the run as failed with it
        run_server(InProcessGrid(2, str(data_dir), run_id=62), {**config, "overrides": overrides + " resume=true"})
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and str(checkpoint) in err and "calls exec" in err
    assert not (tmp_path / "marker").exists()


# ----------------------------------------------------------------------------- a CU's optimizer moments
@pytest.fixture
def cu_state(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cu-state"
    monkeypatch.setenv(STATE_DIR_ENV, str(folder))
    return folder


def _moments() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        "embedding|weight|exp_avg": torch.randn(6, 4, generator=gen).t(),  # not contiguous
        "embedding|weight|step": torch.tensor(7.0),
        "encoder|0.attn|exp_avg_sq": torch.rand(5, generator=gen).to(torch.bfloat16),
    }


def test_cu_state_round_trips_exactly_in_a_private_folder(cu_state):
    path = save_cu_state("run1", 0, 2, _moments())
    assert path == state_path("run1", 0) and path.parent == cu_state / "run1"
    assert (path.parent.stat().st_mode & 0o777) == 0o700 and (path.stat().st_mode & 0o777) == 0o600
    loaded = load_cu_state("run1", 0, before=3)
    assert loaded is not None and set(loaded) == set(_moments())
    for name, value in _moments().items():
        assert loaded[name].dtype == value.dtype and torch.equal(loaded[name], value), name
    assert load_cu_state("run1", 0, before=2) is None  # only an earlier round's moments are taken
    assert load_cu_state("run1", 1, before=3) is None  # no file: fresh moments
    assert load_cu_state("other", 0, before=3) is None


def _damage(path: Path, how: str, tmp_path: Path) -> str:
    """Damage cluster 0's file of run1; returns what the refusal must say."""
    body = path.read_bytes()
    if how == "text":
        path.write_text("these are not moments\n")
        return "not a CU state file"
    if how == "torch pickle":  # what format 1 wrote
        torch.save({"format": 1, "key": "run1", "cluster": 0, "round": 2, "tensors": _moments()}, path)
        return "pickle"
    if how == "hostile pickle":
        path.write_bytes(pickle.dumps(_RunsCode(tmp_path / "marker"), protocol=2))
        return "pickle"
    if how == "truncated":
        path.write_bytes(body[:-7])
        return "truncated"
    if how == "flipped byte":
        path.write_bytes(body[:-1] + bytes([body[-1] ^ 0x01]))
        return "checksum"
    if how == "another run's":
        save_cu_state("run2", 0, 2, _moments()).replace(path)
        return "the run with key 'run2', not to this run ('run1')"
    if how == "another cluster's":
        save_cu_state("run1", 1, 2, _moments()).replace(path)
        return "cluster 1"
    if how in ("edited header", "edited to a later round"):  # the round edited, the checksum left as it was
        header_len = int.from_bytes(body[:8], "little")
        header = json.loads(body[8 : 8 + header_len])
        assert header["__metadata__"]["round"] == "2"
        # 1: an earlier round; 9: a later one, which used to give None (fresh moments, no error): the round was
        # trusted before the checksum was verified
        header["__metadata__"]["round"] = "1" if how == "edited header" else "9"
        new = json.dumps(header, separators=(",", ":")).encode()
        assert len(new) <= header_len
        path.write_bytes(body[:8] + new.ljust(header_len) + body[8 + header_len :])
        return "checksum"
    raise AssertionError(how)


DAMAGES = [
    "text",
    "torch pickle",
    "hostile pickle",
    "truncated",
    "flipped byte",
    "another run's",
    "another cluster's",
    "edited header",
    "edited to a later round",
]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_cu_state_file_is_refused_naming_it(cu_state, tmp_path, how):
    path = save_cu_state("run1", 0, 2, _moments())
    says = _damage(path, how, tmp_path)
    with pytest.raises(CUStateError) as info:
        load_cu_state("run1", 0, before=3)
    message = _one_line(info.value)
    assert isinstance(info.value, CollaPipeError)  # the CU's handler replies with it (fl/cu/client_main.py)
    assert message.startswith(f"cannot use the CU state file {path}: ") and says in message, message
    assert "delete it" in message
    assert not (tmp_path / "marker").exists()
    assert load_cu_state("run1", 0, before=3, reset=True) is None  # optimizer_state=reset reads no file


def test_a_symlinked_key_folder_or_file_is_not_followed(cu_state, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = save_cu_state("real", 0, 2, _moments())
    os.replace(real, elsewhere / "cluster0.pt")
    cu_state.joinpath("run1").symlink_to(elsewhere, target_is_directory=True)
    for call in (lambda: load_cu_state("run1", 0, before=3), lambda: save_cu_state("run1", 0, 3, _moments())):
        with pytest.raises(CUStateError) as info:
            call()
        message = _one_line(info.value)
        assert str(cu_state / "run1") in message and "symbolic link" in message
    remove_cu_state("run1", 0)  # the release removes nothing through the link
    assert (elsewhere / "cluster0.pt").is_file()
    assert load_cu_state("run1", 0, before=3, reset=True) is None

    save_cu_state("run3", 0, 2, _moments())
    linked = state_path("run3", 0)
    linked.unlink()
    linked.symlink_to(elsewhere / "cluster0.pt")
    with pytest.raises(CUStateError, match="symbolic link"):
        load_cu_state("run3", 0, before=3)


@pytest.mark.parametrize("key", ["../escape", "a/b", "", "x" * 65])
def test_a_key_that_is_not_a_run_token_is_refused(cu_state, key):
    with pytest.raises(CUStateError, match="not a run key"):
        save_cu_state(key, 0, 1, _moments())
    with pytest.raises(CUStateError, match="not a run key"):
        load_cu_state(key, 0, before=2)
    remove_cu_state(key, 0)  # nothing to remove, no error at release
    assert not (cu_state.parent / "escape").exists()


@pytest.mark.e2e
@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_a_resumed_run_with_a_damaged_cu_state_file_stops_naming_it(data_dir, tmp_path, monkeypatch, capsys):
    """End to end: the CU's round fails with the file's name and reason, the server records it in the round's
    failures and stops the run with it (it used to go on without that CU for the rest of the run, exit 0)."""
    from collapipe_flwr.errors import CannotContinue
    from collapipe_flwr.fl.server.server_main import run_server
    from tests.fl.server.test_resume import _DyingGrid, _rounds, _ServerKilled
    from tests.inprocess_grid import InProcessGrid

    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "cu-state"))
    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=4 "
        "federation.local_steps=1 federation.optimizer_state=keep runtime.backend=local runtime.precision=fp32 "
        "task.batch_size=8 eval.max_examples=8 model.dropout=0.0 run_name=k"
    )
    config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    with pytest.raises(_ServerKilled):  # a killed server: it sends nothing more, not even the release
        run_server(_DyingGrid(2, str(data_dir), run_id=71, die_at=3), config)
    damaged = next((tmp_path / "cu-state").rglob("cluster0.pt"))
    damaged.write_text("not moments\n")
    with pytest.raises(CannotContinue, match=r"round 3: cluster 0 cannot go on: .*cannot use the CU state file"):
        run_server(InProcessGrid(2, str(data_dir), run_id=72), {**config, "overrides": overrides + " resume=true"})
    assert f"cannot use the CU state file {damaged}" in capsys.readouterr().err
    rounds = _rounds(tmp_path / "k")
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]  # stopped after round 3, its record kept
    errors = [f["error"] for f in rounds[3]["failures"] if f["cluster"] == 0]
    assert errors and f"cannot use the CU state file {damaged}" in errors[0] and "not a CU state file" in errors[0]
    assert not (tmp_path / "k" / "summary.json").exists()
