"""runtime.server_threads: the server's torch threads while rounds train, every core while it evaluates."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.config import load_run_config
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.threads import torch_threads


def test_threads_are_set_inside_and_restored_after_even_on_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            with torch_threads(2):  # the evaluation inside a round's context
                assert torch.get_num_threads() == 2
            assert torch.get_num_threads() == 1
            raise RuntimeError("a failed round")
    assert torch.get_num_threads() == before


def test_zero_leaves_torch_as_it_is():
    before = torch.get_num_threads()
    with torch_threads(0):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_config_default_is_one_thread_and_a_negative_count_is_refused():
    assert load_run_config([]).runtime.server_threads == 1
    with pytest.raises(ConfigError, match="runtime.server_threads=-1"):
        load_run_config(["runtime.server_threads=-1"])
