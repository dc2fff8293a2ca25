"""runtime.handoff: activations and gradients between the CU and its device actors through /dev/shm files.

The tensors must come back bit for bit (any dtype, shape, layout), each file read once and removed, a Ray
pipeline handing over through shared memory must train exactly as through Ray's object store and as the plain
model, and nothing may stay in /dev/shm after the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from collapipe_flwr.config import load_run_config
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.executors import shm_handoff
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.timings import StageSeconds
from tests.pipeline.test_transparency import make_batch, make_model, named_weights, reference_step
from tests.runtimes import runtime

SGD_UNIT = OptimizerSpec(name="sgd", lr=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_a_parked_tensor_comes_back_bit_for_bit_and_its_file_goes(tmp_path, dtype):
    g = torch.Generator().manual_seed(3)
    value = (torch.randn(5, 7, 3, generator=g) * 100).to(dtype)
    view = value.transpose(0, 2)  # not contiguous: parked as its values, in its own shape
    handle = shm_handoff.ParkingLot(tmp_path).park(view)
    assert Path(handle.path).is_file() and handle.shape == (3, 7, 5)
    back = shm_handoff.fetch(handle)
    assert back.dtype == dtype and torch.equal(back, view)
    assert not Path(handle.path).exists()
    assert not Path(handle.path).parent.exists()  # its last tensor read: the folder goes too
    with pytest.raises(RuntimeError, match="is gone: read twice.*runtime.handoff=object_store"):
        shm_handoff.fetch(handle)
    empty = shm_handoff.fetch(shm_handoff.ParkingLot(tmp_path).park(torch.empty(0, 4)))
    assert empty.shape == (0, 4)


def test_small_values_travel_as_they_are_and_large_tensors_are_parked(tmp_path):
    lot = shm_handoff.ParkingLot(tmp_path)
    small = torch.zeros(10)
    assert lot.handover(small) is small
    assert lot.handover(1.5) == 1.5
    large = torch.arange(shm_handoff.PARK_MIN_BYTES // 4, dtype=torch.float32)
    handle = lot.handover(large)
    assert isinstance(handle, shm_handoff.ShmTensor)
    assert torch.equal(shm_handoff.resolve(handle), large)


def test_a_full_shared_memory_sends_the_tensor_itself_and_leaves_no_half_file(tmp_path, monkeypatch):
    import builtins
    import errno

    real_open = builtins.open

    class Full:
        def __init__(self, path, mode):
            self.file = real_open(path, mode)

        def __enter__(self):
            return self

        def write(self, data):
            self.file.write(bytes(data)[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(builtins, "open", lambda path, mode="r", *a, **k: Full(path, mode))
    large = torch.ones(shm_handoff.PARK_MIN_BYTES // 4)
    lot = shm_handoff.ParkingLot(tmp_path)
    assert lot.handover(large) is large
    monkeypatch.undo()
    assert list(lot.path.iterdir()) == []


def test_a_truncated_file_is_refused(tmp_path):
    handle = shm_handoff.ParkingLot(tmp_path).park(torch.ones(8))
    Path(handle.path).write_bytes(b"\0" * 4)
    with pytest.raises(RuntimeError, match="does not hold the 32 bytes"):
        shm_handoff.fetch(handle)


def test_the_choice_follows_where_the_actors_run():
    choose = shm_handoff.choose
    assert choose("auto", "cu", ["cu", "cu"], True) == "shm"
    assert choose("auto", "cu", ["cu", "box1"], True) == "object_store"
    assert choose("auto", "cu", ["cu"], False) == "object_store"
    assert choose("object_store", "cu", ["cu"], True) == "object_store"
    assert choose("shm", "cu", ["cu"], True) == "shm"
    with pytest.raises(ValueError, match=r"handoff=shm but device actors \[1\] run on another host"):
        choose("shm", "cu", ["cu", "box1"], True)
    with pytest.raises(ValueError, match="is not writable here"):
        choose("shm", "cu", ["cu"], False)
    with pytest.raises(ConfigError, match="runtime.handoff='disk' must be one of auto, object_store, shm"):
        load_run_config(["runtime.handoff=disk"])


@pytest.mark.e2e
def test_folders_of_processes_that_are_gone_are_swept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = shm_handoff.ParkingLot(tmp_path, tag="ab12", pid=int(gone.stdout))
    dead.park(torch.ones(3))
    mine = shm_handoff.ParkingLot(tmp_path)
    mine.park(torch.ones(3))
    assert shm_handoff.remove_stale(tmp_path) == [dead.path]
    assert not dead.path.exists() and mine.path.is_dir()


def test_two_pipelines_of_one_process_keep_their_tensors_apart(tmp_path):
    one, two = shm_handoff.ParkingLot(tmp_path, tag="a"), shm_handoff.ParkingLot(tmp_path, tag="b")
    handle = one.park(torch.ones(4))
    kept = one.park(torch.zeros(4))
    assert two.clear() == 0  # the other pipeline's step start leaves this one's tensor alone
    assert torch.equal(shm_handoff.fetch(handle), torch.ones(4))
    assert one.path.is_dir()  # a tensor still waits there
    assert torch.equal(shm_handoff.fetch(kept), torch.zeros(4)) and not one.path.exists()
    one.park(torch.ones(4))
    assert one.clear() == 1
    one.remove()
    assert not one.path.exists() and two.path != one.path


def _ours(cu_folder: Path, pids) -> list[Path]:
    """The hand-over folders of a pipeline: the CU side's and its device actors'."""
    folders = [cu_folder, *(Path("/dev/shm") / f"{shm_handoff.FOLDER_PREFIX}{pid}" for pid in pids)]
    return [folder for folder in folders if folder.is_dir()]


def _train(model, batch, mode: str):
    head = LocalHead(model.head, SGD_UNIT)
    rt = runtime(backend="ray", handoff=mode)
    with ClusterPipeline(model.embedding, model.blocks, (1, 3, 2), SGD_UNIT, runtime=rt) as pipe:
        used = pipe.stages.handoff
        before = named_weights(model.embedding, pipe.encoder_state_dict(), model.head)
        result = pipe.train_step(batch, 4, head)
        after = named_weights(model.embedding, pipe.encoder_state_dict(), model.head)
        pids = [process.pid for process in pipe.stages.processes().values()]
        cu_folder = pipe.stages._parking.path
        left = [f for folder in _ours(cu_folder, pids) for f in folder.iterdir()]
    still = _ours(cu_folder, pids)  # after the run: the CU's and every actor's folder removed
    return used, result.loss, {k: before[k] - after[k] for k in before}, left + still


@pytest.mark.e2e
@pytest.mark.skipif(not shm_handoff.available(), reason="needs a writable /dev/shm")
def test_a_ray_pipeline_trains_the_same_through_shared_memory(ray_session):
    import copy

    model, batch = make_model("transformer"), make_batch("transformer")
    ref_loss, _, ref_grads, _ = reference_step(model, batch, SGD_UNIT)
    used, loss, grads, left = _train(copy.deepcopy(model), batch, "shm")
    used_os, loss_os, grads_os, _ = _train(copy.deepcopy(model), batch, "object_store")
    assert (used, used_os) == ("shm", "object_store")  # the run really took the shared-memory way
    assert left == []  # every parked tensor was read within the step; no folder outlived the run
    assert loss == loss_os == pytest.approx(ref_loss, rel=1e-12)
    for name, g in grads.items():
        assert torch.equal(g, grads_os[name]), name  # the same bits either way
        expected = ref_grads[name] if ref_grads[name] is not None else torch.zeros_like(g)
        torch.testing.assert_close(g, expected, rtol=1e-5, atol=1e-12)


def test_a_nested_state_comes_back_equal_with_its_large_tensors_parked(tmp_path):
    lot = shm_handoff.ParkingLot(tmp_path)
    large = torch.randn(shm_handoff.PARK_MIN_BYTES // 4 + 1)
    state = {
        "0.w": large,
        "0.b": torch.ones(3),
        "opt": {"exp_avg": large * 2, "step": torch.tensor(4.0)},
        "n": [7, large],
        "seconds": StageSeconds(1.5, 0.25),  # a named tuple (what a stage's step answers) keeps its type
        "pair": (large, 2),
    }
    parked = lot.handover_tree(state)
    assert isinstance(parked["0.w"], shm_handoff.ShmTensor) and isinstance(
        parked["opt"]["exp_avg"], shm_handoff.ShmTensor
    )
    assert parked["0.b"] is state["0.b"] and parked["n"][0] == 7 and isinstance(parked["n"], list)
    back = shm_handoff.resolve_tree(parked)
    assert torch.equal(back["0.w"], large) and torch.equal(back["opt"]["exp_avg"], large * 2)
    assert torch.equal(back["n"][1], large) and back["opt"]["step"] == 4.0
    assert back["seconds"] == StageSeconds(1.5, 0.25) and type(back["seconds"]) is StageSeconds
    assert type(back["pair"]) is tuple and torch.equal(back["pair"][0], large) and back["pair"][1] == 2
    assert not lot.path.exists()  # every parked tensor read once: nothing left in shared memory


def _shmem_mib(pid: int) -> float:
    """``RssShmem`` of process ``pid`` (MiB): shared-memory pages mapped into it, Ray's object store's among them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _device_shmem(mode: str, rounds: int = 6, moves: int = 8) -> dict[str, float | bool]:
    """A device actor's ``RssShmem`` (MiB) through one pipeline's life, hand-over ``mode``: ``fresh``, the largest
    once every device holds its first segment (a block of ~12 MiB of weights, placed when the actor starts);
    ``weights``, its largest growth over ``rounds`` reads and writes of the encoder's weights (as every federated
    round does); ``moves``, its largest growth over ``moves`` re-partitions of the two blocks between the two devices
    ((1, 1) and (2, 0) in turn: blocks and their optimizer state move each time); ``same``, whether the weights
    came through all of it unchanged. One pipeline per mode: its actors' start is most of the test's time."""
    from collapipe_flwr.models.transformer import TransformerConfig, build_transformer

    sizes = dict(d_model=512, n_heads=4, d_ff=2048, enc_layers=2, dec_layers=1, dropout=0.0, max_len=32, pad_id=0)
    model = build_transformer(TransformerConfig(src_vocab=50, tgt_vocab=50, **sizes))
    sent = {k: v.clone() for k, v in model.blocks.state_dict().items()}
    rt = runtime(backend="ray", handoff=mode)
    with ClusterPipeline(model.embedding, model.blocks, (1, 1), SGD_UNIT, runtime=rt) as pipe:
        assert pipe.stages.handoff == mode
        pids = [process.pid for process in pipe.stages.processes().values()]
        fresh = max(_shmem_mib(pid) for pid in pids)
        start = [_shmem_mib(pid) for pid in pids]
        for _ in range(rounds):
            pipe.load_encoder_state_dict(pipe.encoder_state_dict())
        weights = max(_shmem_mib(pid) - s for pid, s in zip(pids, start))
        start = [_shmem_mib(pid) for pid in pids]
        for i in range(moves):
            pipe.placement.repartition((2, 0) if i % 2 == 0 else (1, 1))
        moved = max(_shmem_mib(pid) - s for pid, s in zip(pids, start))
        got = pipe.encoder_state_dict()
    same = all(torch.equal(sent[k], got[k]) for k in sent)
    return {"fresh": fresh, "weights": weights, "moves": moved, "same": same}


@pytest.mark.e2e
@pytest.mark.skipif(not shm_handoff.available(), reason="needs a writable /dev/shm")
def test_weights_and_blocks_through_shared_memory_leave_no_object_store_pages_in_the_device(ray_session):
    """Through Ray's object store the pages of what a device receives stay mapped into it (and charged to its memory
    cgroup): its first segment when it starts, every read of its weights, the blocks a new delta moves to it. The
    reference run through the object store shows each of those (so the check can fail); the shm hand-over must
    show none, and a device started for a plan receives its blocks once, by the hand-over the CU chose (not in its
    actor's constructor through the object store and again by a load)."""
    store = _device_shmem("object_store")
    shm = _device_shmem("shm")
    assert store["same"] and shm["same"]
    assert store["fresh"] > 8.0 and store["weights"] > 8.0 and store["moves"] > 8.0, store
    assert shm["fresh"] < 2.0 and shm["weights"] < 2.0 and shm["moves"] < 2.0, shm


def test_a_segment_taken_apart_for_shared_memory_is_rebuilt_equal(tmp_path):
    """parked_module / unparked_module against the module itself: the same state, the same output, the same
    frozen parameters, its non-persistent buffers; a module whose parameters are shared is refused (None)."""
    from collapipe_flwr.models.transformer import EncoderBlock

    torch.manual_seed(0)
    segment = torch.nn.ModuleList([EncoderBlock(256, 4, 512, 0.0) for _ in range(2)])
    segment[0].layer.norm1.weight.requires_grad_(False)  # as a frozen (LoRA base) weight
    lot = shm_handoff.ParkingLot(tmp_path)
    parked = shm_handoff.parked_module(segment, lot)
    assert parked is not None
    skeleton, state = parked
    assert all(p.is_meta for p in skeleton.parameters())  # no weights travel with the structure
    assert any(isinstance(v, shm_handoff.ShmTensor) for v in state.values())
    rebuilt = shm_handoff.unparked_module(skeleton, state)
    assert not lot.path.exists()
    for (name, want), got in zip(segment.state_dict().items(), rebuilt.state_dict().values()):
        assert torch.equal(want, got), name
    assert [p.requires_grad for p in rebuilt.parameters()] == [p.requires_grad for p in segment.parameters()]
    x, mask = torch.randn(2, 5, 256), torch.ones(2, 5, dtype=torch.long)
    segment.eval(), rebuilt.eval()
    assert torch.equal(rebuilt[1](rebuilt[0](x, mask), mask), segment[1](segment[0](x, mask), mask))

    # a non-persistent buffer (a Llama block's rotary inv_freq) is not in the state dict: it travels beside it
    with_buffer = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    with_buffer[0].register_buffer("table", torch.arange(4.0), persistent=False)
    parked = shm_handoff.parked_module(with_buffer, lot)
    assert parked is not None
    rebuilt = shm_handoff.unparked_module(*parked)
    assert torch.equal(rebuilt[0].table, torch.arange(4.0)) and "0.table" not in rebuilt.state_dict()
    assert torch.equal(rebuilt[0].weight, with_buffer[0].weight)
    tied = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    tied[1].weight = tied[0].weight
    assert shm_handoff.parked_module(tied, lot) is None


def test_a_llama_segment_takes_the_shared_memory_way_and_computes_the_same(tmp_path):
    """A Llama block keeps its rotary ``inv_freq`` as a non-persistent buffer; its segment used to be refused the
    shared-memory hand-over (through Ray's object store instead). Rebuilt from the parked state it gives the same
    output as the segment itself, buffers included."""
    from collapipe_flwr.models.hf import load_hf_model, split_hf_model
    from tests.models.hf.test_hf_split import make_batch, make_config

    config, task = make_config("llama")
    torch.manual_seed(0)
    split = split_hf_model(load_hf_model(config, task))
    segment = torch.nn.ModuleList(list(split.blocks[1:3]))
    state = segment.state_dict()
    assert any(name not in state for name, _ in segment.named_buffers())  # the case this test is about
    parked = shm_handoff.parked_module(segment, shm_handoff.ParkingLot(tmp_path))
    assert parked is not None
    rebuilt = shm_handoff.unparked_module(*parked)
    for (name, want), (_, got) in zip(segment.named_buffers(), rebuilt.named_buffers(), strict=True):
        assert torch.equal(want, got), name
    batch = make_batch(task, 0)
    x, mask = split.embedding(batch["input_ids"]).detach(), batch["attention_mask"]
    segment.eval(), rebuilt.eval()
    want, got = x, x
    for a, b in zip(segment, rebuilt, strict=True):
        want, got = a(want, mask), b(got, mask)
    assert torch.equal(want, got)
