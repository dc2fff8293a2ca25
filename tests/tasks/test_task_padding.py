"""Batch widths in steps of ``task.pad_multiple``: the rounding by hand, the real tasks' batches, and padding that
changes no loss (a batch padded to its longest sequence is the reference)."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.batching import attention_mask, pad, padded_width
from collapipe_flwr.tasks.registry import build_task
from tests.task_specs import specs


@pytest.mark.parametrize(
    ("longest", "multiple", "limit", "width"),
    [(13, 8, 64, 16), (16, 8, 64, 16), (61, 8, 64, 64), (61, 8, 62, 62), (5, 1, 0, 5), (9, 4, 0, 12), (0, 8, 64, 0)],
)
def test_padded_width_by_hand(longest, multiple, limit, width):
    assert padded_width(longest, multiple, limit) == width


def test_a_multiple_below_one_is_refused_with_the_key_to_set():
    with pytest.raises(ConfigError, match="task.pad_multiple"):
        padded_width(5, 0)


def test_pad_and_mask_agree_on_the_rounded_width():
    seqs = [[5, 6, 7], [8]]
    ids, mask = pad(seqs, 0, multiple=4), attention_mask(seqs, multiple=4)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_task_spec_refuses_a_bad_pad_multiple():
    with pytest.raises(ConfigError, match="task.pad_multiple=0"):
        specs("translation", "transformer_tiny", {"pad_multiple": 0})


@pytest.fixture(scope="module")
def translation_pair(data_dir, tmp_path_factory):
    """The translation task with widths in steps of 8 (the conf default) and padded to the longest only, sharing
    one tokenizer cache."""
    cache = tmp_path_factory.mktemp("cache")
    return tuple(
        build_task(*specs("translation", "transformer_tiny", {"pad_multiple": p}), data_dir, seed=0, cache_dir=cache)
        for p in (8, 1)
    )


def test_translation_batches_have_widths_in_steps_of_eight_within_max_len(translation_pair):
    task, _ = translation_pair
    assert task.spec.pad_multiple == 8  # conf/task/translation.yaml
    widths = set()
    for batch in task.batches(list(range(2048)), 64, seed=0):
        for key in ("input_ids", "decoder_input_ids", "labels"):
            width = batch[key].shape[1]
            assert width % 8 == 0 or width == task.max_len
            assert width <= task.max_len
            widths.add(width)
        lengths = batch["attention_mask"].sum(1)
        assert int(lengths.max()) > batch["input_ids"].shape[1] - 8  # never a whole extra step of padding
    assert len(widths) <= task.max_len // 8


def test_padding_in_steps_changes_no_loss(translation_pair):
    stepped, longest = translation_pair
    model = stepped.build_model(seed=0).eval()  # eval: no dropout, so the two batches see the same function
    indices = list(range(256))
    rounded = 0
    with torch.no_grad():
        for a, b in zip(stepped.batches(indices, 32, seed=1), longest.batches(indices, 32, seed=1)):
            rounded += a["input_ids"].shape[1] != b["input_ids"].shape[1]
            loss_a, count_a = model.loss_terms(a)
            loss_b, count_b = model.loss_terms(b)
            assert int(count_a) == int(count_b)
            assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-5)
    assert rounded > 0  # the check compared batches that really were padded differently
