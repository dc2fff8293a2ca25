"""Row-sparse embedding gradients on the CU (pipeline/sparse_embedding.py): the update over m micro-batches equals
the dense embedding's (the reference: the same module with torch's default dense gradient), and only embeddings
that train and are not tied to another module's weight are switched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from collapipe_flwr.pipeline.sparse_embedding import densify_gradients, use_sparse_gradients


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 8, padding_idx=0)
        self.positions = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, ids):
        return self.norm(self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))[None])


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_m_micro_batches_update_as_the_dense_embedding_does(name):
    torch.manual_seed(0)
    dense = Embed()
    sparse = copy.deepcopy(dense)
    assert len(use_sparse_gradients(sparse)) == 2
    make = {"adam": lambda p: torch.optim.Adam(p, lr=0.01), "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}
    opt_dense, opt_sparse = make[name](dense.parameters()), make[name](sparse.parameters())
    for _ in range(3):
        ids = torch.randint(0, 50, (12, 16))
        ids[:, 12:] = 0  # padding
        target = torch.randn(12, 16, 8)
        for module, opt in ((dense, opt_dense), (sparse, opt_sparse)):
            for mb, tb in zip(ids.chunk(4), target.chunk(4)):  # m = 4 micro-batches, gradients accumulate
                ((module(mb) - tb) ** 2).sum().backward()
            if module is sparse:
                assert sparse.tokens.weight.grad.is_sparse
                densify_gradients(module)
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (k, a), b in zip(dense.state_dict().items(), sparse.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=k)  # the rows summed in another order
    assert not torch.equal(dense.tokens.weight, Embed().tokens.weight)


def test_frozen_and_tied_embeddings_keep_dense_gradients():
    module = Embed()
    module.positions.weight.requires_grad_(False)
    head = nn.Linear(8, 50, bias=False)
    head.weight = module.tokens.weight  # tied inside the module: its other use gives a dense gradient
    module.head = head
    assert use_sparse_gradients(module) == []
    assert not module.tokens.sparse and not module.positions.sparse
