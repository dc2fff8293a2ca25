"""What dropout costs a training step on the CPU, with torch's kernel and with the project's cheaper mask
(``models/fast_dropout.py``): each task's default embedding and encoder blocks (the CU's and the devices' work),
forward and backward on one torch thread, in three variants of the very same model, alternating so all three see
the same background load:

* ``torch``: every dropout module torch's ``nn.Dropout`` (``F.dropout``: one ``bernoulli_`` draw per element);
* ``fast``: the model as the builders return it (``FastDropout``: four elements per 64-bit draw);
* ``none``: every dropout probability 0 (torch then returns its input untouched, ``aten::_dropout_impl``), so this
  variant does every other operation of the step.

Attention-probability dropout: ``nn.MultiheadAttention``'s (translation) is torch's in the first two variants (no
module to swap); BERT's blocks run the project's attention function (``fast_dropout.attention``) in ``fast`` and
transformers' sdpa in ``torch``; off in ``none``. Prints ``name: value`` lines:

* ``step_ms_<task>_<variant>``: median milliseconds of one forward + backward;
* ``dropout_share_<task>_torch`` / ``_fast``: 1 - none / variant, the share of the step its dropout costs;
* ``fast_dropout_speedup_<task>``: torch / fast.

    python benchmarks/dropout_share.py [--tasks translation classification ner] [--steps 8]

Reads the task's vocabulary from the prepared data (``./data`` or ``COLLAPIPE_DATA_DIR``); the batch is random token
ids of the task's batch size and ``max_len``.
"""

from __future__ import annotations

import copy
import statistics
import time

import command_line  # benchmarks/command_line.py, beside this script
import torch
from torch import nn

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config
from collapipe_flwr.models.fast_dropout import with_dropout_kernel
from collapipe_flwr.models.split import SplitModel


def _modules(model: SplitModel):
    return (module for part in model.parts() for module in part.modules())


def with_torch_dropout(model: SplitModel) -> SplitModel:
    """A copy of ``model`` on torch's dropout kernels (``model.dropout_kernel: torch``): every ``FastDropout``
    back to ``nn.Dropout`` (same p), BERT's attention back on transformers' sdpa function."""
    return with_dropout_kernel(copy.deepcopy(model), "torch")


def without_dropout(model: SplitModel) -> SplitModel:
    """A copy of ``model`` whose every dropout probability is 0: dropout modules' ``p``, ``nn.MultiheadAttention``'s
    ``dropout`` and the attention-probability dropout Hugging Face's attention modules keep as ``dropout_prob``."""
    quiet = copy.deepcopy(model)
    for module in _modules(quiet):
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        elif isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
        if isinstance(getattr(module, "dropout_prob", None), float):
            module.dropout_prob = 0.0
    return quiet


def step_seconds(model: SplitModel, input_ids: torch.Tensor, mask: torch.Tensor) -> float:
    """One forward + backward of the embedding and every encoder block (``SplitModel.encode``), in seconds."""
    start = time.perf_counter()
    model.encode(input_ids, mask).float().sum().backward()
    for part in model.parts():
        part.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    args = command_line.parse(__doc__ or "", tasks=["translation", "classification", "ner"], steps=8)
    torch.set_num_threads(1)
    for name in args.tasks:
        cfg = load_run_config([f"task={name}"])
        torch.manual_seed(0)
        model = wiring.build_task(cfg).build_model(0)
        for part in model.parts():
            part.train()
        models = {"torch": with_torch_dropout(model), "fast": model, "none": without_dropout(model)}
        vocab = next(m for m in _modules(model) if isinstance(m, nn.Embedding)).num_embeddings
        input_ids = torch.randint(1, vocab, (cfg.task.batch_size, cfg.task.max_len))
        mask = torch.ones_like(input_ids)
        times: dict[str, list[float]] = {kind: [] for kind in models}
        for _ in range(args.steps + 1):
            for kind, variant in models.items():
                times[kind].append(step_seconds(variant, input_ids, mask))
        median = {kind: statistics.median(values[1:]) * 1e3 for kind, values in times.items()}
        for kind, ms in median.items():
            print(f"step_ms_{name}_{kind}: {ms:.1f}")
        for kind in ("torch", "fast"):
            print(f"dropout_share_{name}_{kind}: {1 - median['none'] / median[kind]:.3f}")
        print(f"fast_dropout_speedup_{name}: {median['torch'] / median['fast']:.3f}")


if __name__ == "__main__":
    main()
