"""OptimizerSpec's Adam / AdamW take torch's fused kernel where it fits; the update must be the one torch's
reference (single-tensor, one op per moment) implementation makes."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.pipeline.optim import OptimizerSpec, fused_kernel_fits


def _params(seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in ((64, 32), (32,), (7, 5, 3))]


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_fused_update_equals_the_single_tensor_reference(name):
    spec = OptimizerSpec(name=name, lr=1e-2, weight_decay=0.01)
    ours, ref = _params(0), _params(0)
    optimizer = spec.build(ours)
    reference_class = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    reference = reference_class(ref, lr=1e-2, betas=spec.betas, weight_decay=0.01, foreach=False, fused=False)
    assert optimizer.param_groups[0]["fused"] is True
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        for a, b in zip(ours, ref):
            grad = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    for a, b, start in zip(ours, ref, _params(0)):
        assert (a - start).abs().max() > 0.05  # 20 steps at lr 1e-2 moved every tensor
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_state_saved_without_the_fused_kernel_resumes_with_it():
    """A run's optimizer state saved by a build without the fused kernel (an earlier checkpoint) loads and goes on
    as the reference that never stopped."""
    spec = OptimizerSpec(name="adam", lr=1e-2)
    ours, ref = _params(0), _params(0)
    old = torch.optim.Adam(ours, lr=1e-2, betas=spec.betas, fused=False)
    reference = torch.optim.Adam(ref, lr=1e-2, betas=spec.betas, fused=False)
    gen = torch.Generator().manual_seed(2)
    grads = [[torch.randn(p.shape, generator=gen) for p in ours] for _ in range(6)]
    for step, grad in enumerate(grads):
        if step == 3:  # checkpoint, then resume with the spec's (fused) optimizer
            state = old.state_dict()
            old = spec.build(ours)
            old.load_state_dict(state)
        for a, b, g in zip(ours, ref, grad):
            a.grad, b.grad = g.clone(), g.clone()
        old.step()
        reference.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_the_fused_kernel_is_not_asked_for_tensors_it_does_not_take():
    assert fused_kernel_fits(_params(0))
    assert not fused_kernel_fits([torch.zeros(3, dtype=torch.int64)])
    assert not fused_kernel_fits([torch.zeros(3, device="meta")])
