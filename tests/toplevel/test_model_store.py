"""model_store: a saved tiny model loads back with equal weights and the same metric; broken folders are
one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from collapipe_flwr.config import compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.model_store import PARTS, load_model, save_model
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.spec import parse_model, parse_task


@pytest.fixture(scope="module")
def saved(data_dir, tmp_path_factory):
    """A slightly trained classification/bert_tiny model saved under a run folder, with its task."""
    cache = tmp_path_factory.mktemp("cache")
    run = tmp_path_factory.mktemp("run")
    cfg = compose(["task=classification", "model=bert_tiny", f"data_dir={data_dir}"])
    task_spec = parse_task(cfg["task"])
    task = build_task(task_spec, parse_model(cfg["model"], task_spec), data_dir, cfg["seed"], cache)
    model = task.build_model(cfg["seed"])
    params = [p for part in model.parts() for p in part.parameters()]
    optimizer = task.model_spec.optimizer.build(params)
    for batch in task.batches(list(range(32)), 16, seed=0):  # move the weights away from the seeded init
        optimizer.zero_grad()
        s, c = model.loss_terms(batch)
        (s / c).backward()
        optimizer.step()
    folder = save_model(run, cfg, model.embedding, model.blocks, model.head, info={"steps": 2}, task=task)
    return run, folder, cfg, task, model, cache


def test_layout_and_meta(saved):
    run, folder, cfg, _, _, _ = saved
    assert folder == run / "model"
    for part in PARTS:
        assert (folder / f"{part}.safetensors").is_file()
    meta = json.loads((folder / "model.json").read_text())
    assert meta["format"] == 1 and meta["info"] == {"steps": 2}
    assert meta["config"]["task"] == cfg["task"] and meta["config"]["model"] == cfg["model"]
    assert meta["tokenizer"]["kind"] == "bert_wordpiece" and meta["tokenizer"]["vocab_size"] > 20000
    assert (folder / meta["tokenizer"]["files"]["vocab"]).is_file()
    assert not list(folder.glob("*.tmp")) and not list(folder.glob(".*"))


@pytest.mark.parametrize("which", ["run", "model"])
def test_round_trip_weights_and_metric(saved, which):
    run, folder, _, task, model, cache = saved
    cfg, loaded_task, loaded = load_model(run if which == "run" else folder, cache_dir=cache)
    assert cfg["task"]["name"] == "classification"
    for original, part in zip(model.parts(), loaded.parts()):
        a, b = original.state_dict(), part.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    before = task.evaluate(model, max_examples=32, batch_size=16)
    after = loaded_task.evaluate(loaded, max_examples=32, batch_size=16)
    assert after[task.metric_name] == before[task.metric_name]
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-6)


def test_missing_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="has no model/model.json"):
        load_model(tmp_path)


def test_missing_or_mismatched_file_is_a_config_error(saved, tmp_path):
    import shutil

    _, folder, _, _, _, cache = saved
    copy = tmp_path / "run"
    shutil.copytree(folder, copy / "model")
    (copy / "model" / "head.safetensors").unlink()
    with pytest.raises(ConfigError, match="head.safetensors is missing"):
        load_model(copy, cache_dir=cache)
    shutil.copyfile(folder / "embedding.safetensors", copy / "model" / "head.safetensors")
    with pytest.raises(ConfigError, match="head.safetensors does not fit") as err:
        load_model(copy, cache_dir=cache)
    assert "\n" not in str(err.value)


def test_a_model_saved_before_the_lr_schedule_rename_loads(saved, tmp_path):
    import shutil

    _, folder, _, _, model, cache = saved
    shutil.copytree(folder, tmp_path / "model")
    meta_path = tmp_path / "model" / "model.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["model"]["schedule"] = meta["config"]["model"].pop("lr_schedule")
    meta_path.write_text(json.dumps(meta))
    cfg, task, loaded = load_model(tmp_path, cache_dir=cache)
    assert "schedule" not in cfg["model"] and task.model_spec.lr_schedule.decay == "none"
    assert all(torch.equal(a, b) for a, b in zip(model.head.state_dict().values(), loaded.head.state_dict().values()))


def test_a_model_with_nan_weights_is_refused_in_one_line(saved, tmp_path):
    """`evaluate` of a diverged model used to report loss=nan and exit 0."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, folder, _, _, _, cache = saved
    copy = tmp_path / "run"
    shutil.copytree(folder, copy / "model")
    encoder = copy / "model" / "encoder.safetensors"
    state = load_file(str(encoder))
    name = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(encoder), metadata={"format": "pt", "part": "encoder"})
    with pytest.raises(ConfigError, match=f"NaN or infinite values in {name}") as err:
        load_model(copy, cache_dir=cache)
    assert "\n" not in str(err.value)


@pytest.mark.e2e
def test_a_full_disk_is_one_line_naming_the_file_and_the_old_file_stays(tmp_path):
    """A 256 KiB tmpfs: torch.save of a 1 MB checkpoint fails (it raised RuntimeError '[enforce fail at
    inline_container.cc]' with no word of the disk) and safetensors likewise; the previous files are intact."""
    import subprocess

    from safetensors.torch import save_file

    from collapipe_flwr.atomic_files import replace_atomically
    from collapipe_flwr.errors import CollaPipeError
    from collapipe_flwr.model_store import _atomic

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        old = full / "checkpoint.pt"
        replace_atomically(old, lambda fh: torch.save({"round": 1}, fh))
        big = {"w": torch.zeros(512, 512)}  # 1 MiB
        with pytest.raises(CollaPipeError, match=r"cannot write .*checkpoint.pt: .*disk") as err:
            replace_atomically(old, lambda fh: torch.save(big, fh))
        assert "\n" not in str(err.value)
        assert torch.load(old)["round"] == 1 and sorted(p.name for p in full.iterdir()) == ["checkpoint.pt"]
        with pytest.raises(CollaPipeError, match=r"cannot write .*encoder.safetensors") as err:
            _atomic(full / "encoder.safetensors", lambda tmp: save_file(big, tmp))
        assert "\n" not in str(err.value) and sorted(p.name for p in full.iterdir()) == ["checkpoint.pt"]
    finally:
        subprocess.run(["umount", str(full)], check=False)
