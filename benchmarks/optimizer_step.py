"""One optimizer step over each task's whole default model, torch's fused Adam kernel against its default
(single-tensor, one op per moment) implementation, on one torch thread, alternating so both see the same
background load. The CU's embedding, every device's segment and the server's decoder take one such step per
local step (``pipeline/optim.py``, which picks the fused kernel where it fits). Prints ``name: value`` lines:

* ``params_<task>``: trainable parameters of the task's default model;
* ``adam_step_ms_<task>_default`` / ``adam_step_ms_<task>_fused``: median milliseconds of one step;
* ``adam_fused_speedup_<task>``: default / fused.

    python benchmarks/optimizer_step.py [--tasks translation classification ner] [--steps 12]
"""

from __future__ import annotations

import statistics
import time

import command_line  # benchmarks/command_line.py, beside this script
import torch

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config


def task_params(task_name: str) -> list[torch.nn.Parameter]:
    """The trainable parameters of ``task_name``'s default model (embedding, encoder, head), with gradients set."""
    cfg = load_run_config([f"task={task_name}"])
    task = wiring.build_task(cfg)
    torch.manual_seed(0)
    model = task.build_model(0)
    params = [p for part in (model.embedding, model.blocks, model.head) for p in part.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def main() -> None:
    args = command_line.parse(__doc__ or "", tasks=["translation", "classification", "ner"], steps=12)
    torch.set_num_threads(1)
    for name in args.tasks:
        params = task_params(name)
        optimizers = {
            "default": torch.optim.Adam(params, lr=1e-4, fused=False),
            "fused": torch.optim.Adam(params, lr=1e-4, fused=True),
        }
        times: dict[str, list[float]] = {kind: [] for kind in optimizers}
        for _ in range(args.steps + 2):
            for kind, optimizer in optimizers.items():
                start = time.perf_counter()
                optimizer.step()
                times[kind].append(time.perf_counter() - start)
        median = {kind: statistics.median(values[2:]) * 1e3 for kind, values in times.items()}
        print(f"params_{name}: {sum(p.numel() for p in params)}")
        for kind, ms in median.items():
            print(f"adam_step_ms_{name}_{kind}: {ms:.2f}")
        print(f"adam_fused_speedup_{name}: {median['default'] / median['fused']:.2f}")


if __name__ == "__main__":
    main()
