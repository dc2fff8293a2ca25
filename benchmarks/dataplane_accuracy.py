"""Accuracy effect of the data plane's wire compression (dataplane.compression: none | fp16 | int8).

A small CU-side encoder (embedding + one Transformer encoder layer, H = 64) and a server-side token head
(linear classifier over C classes, cross-entropy) train together for --steps steps through the real data
plane (DecoderHost / DecoderClient on loopback): z_enc goes up, dL/dz_enc comes back and updates the
encoder. The task is learnable (each token's class is a fixed function of its id). Same seed, same
batches in every mode, so the loss gap is the wire's effect. Prints ``name: value`` lines:
``accuracy_<mode>_final_loss`` (mean loss of the last 10 steps) and ``accuracy_<mode>_vs_none`` (ratio).

Run: ``python benchmarks/dataplane_accuracy.py [--steps 150]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec  # noqa: E402
from collapipe_flwr.fl.dataplane.auth import cluster_key  # noqa: E402
from collapipe_flwr.fl.server.decoder.host import DecoderHost  # noqa: E402
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec  # noqa: E402

V, C, H, B, T = 200, 10, 64, 32, 16


class TokenHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(H, C)

    def loss_terms(self, hidden, attention_mask, batch):
        logits = self.out(hidden)
        loss = nn.functional.cross_entropy(logits.reshape(-1, C), batch["labels"].reshape(-1), reduction="sum")
        return loss, torch.tensor(batch["labels"].numel())


def run(mode: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    embed = nn.Embedding(V, H)
    layer = nn.TransformerEncoderLayer(H, 4, 128, dropout=0.0, batch_first=True)
    enc_opt = torch.optim.Adam([*embed.parameters(), *layer.parameters()], lr=3e-3)
    head = TokenHead()
    spec = DecoderHostSpec(hidden_size=H, bind="127.0.0.1", compression=mode)
    host = DecoderHost(head, torch.optim.Adam(head.parameters(), lr=3e-3), "acc", spec)
    host.start()
    host.open_round(1, [0])
    g = torch.Generator().manual_seed(1)
    classes = torch.randint(0, C, (V,), generator=g)
    losses = []
    try:
        spec = DecoderClientSpec(compression=mode)
        with DecoderClient(host.address, cluster_key("acc", 1, 0), 1, 0, spec) as client:
            for _ in range(steps):
                ids = torch.randint(0, V, (B, T), generator=g)
                mb = {"attention_mask": torch.ones(B, T, dtype=torch.long), "labels": classes[ids]}
                z = layer(embed(ids))
                loss, grads = client([z.detach()], [mb])
                enc_opt.zero_grad()
                z.backward(grads[0])
                enc_opt.step()
                losses.append(loss)
    finally:
        host.stop(grace_s=0)
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    torch.set_num_threads(1)
    final = {}
    for mode in ("none", "fp16", "int8"):
        losses = run(mode, args.steps)
        final[mode] = sum(losses[-10:]) / 10
        print(f"accuracy_{mode}_first_loss: {losses[0]:.5f}")
        print(f"accuracy_{mode}_final_loss: {final[mode]:.5f}")
    for mode in ("fp16", "int8"):
        print(f"accuracy_{mode}_vs_none: {final[mode] / final['none']:.4f}")
    print(f"accuracy_steps: {args.steps}")


if __name__ == "__main__":
    main()
