"""Compute context: the fused Adam step, CPU contention (the virtual clock's assumption), a Hugging Face model
through the pipeline, and the GPU's speed-ups."""

from __future__ import annotations

from table_rows.row import Row, figure_named


def optimizer_rows(opt_args: str = "") -> list[Row]:
    """One Adam step over each task's whole default model, the fused kernel (pipeline/optim.py uses it) against
    torch's default implementation: context for the step times, no target."""
    return [
        Row(
            f"Adam step over the {task} model, speed-up of the fused kernel (1 thread)",
            lambda f, task=task: f[f"adam_fused_speedup_{task}"],
            "x",
            None,
            f"python benchmarks/optimizer_step.py {opt_args}".strip(),
            lower_is_better=False,
        )
        for task in ("translation", "classification", "ner")
    ]


def contention_rows(contention_args: str = "") -> list[Row]:
    """The virtual clock's one assumption about the machine: a call's CPU seconds do not grow when P processes
    share the cores (target: within 10% at P = 4 on 2 cores); its wall seconds, which do, for context."""
    command = f"python benchmarks/cpu_contention.py {contention_args}".strip()
    return [
        Row(
            "a call's CPU seconds with 4 processes at once, vs alone (virtual clock)",
            lambda f: f["contention_cpu_ratio_P4"],
            "x",
            1.1,
            command,
        ),
        Row(
            "a call's CPU seconds with 8 processes at once, vs alone",
            lambda f: f["contention_cpu_ratio_P8"],
            "x",
            None,
            command,
        ),
        Row(
            "a call's wall seconds with 4 processes at once, vs alone",
            lambda f: f["contention_wall_ratio_P4"],
            "x",
            None,
            command,
        ),
    ]


def hf_rows(hf_args: str) -> list[Row]:
    """GPT-2 small's shape (124M parameters, b = 4 x 128, fp32, AdamW) through the pipeline: the largest per-device
    peak (params + gradients + optimizer state + saved activations) for S = 1, 2, 4 with and without LoRA (r = 8),
    and the split model's step over the un-split HF model's in the same process (context: no targets)."""
    command = f"python benchmarks/hf_pipeline_memory.py {hf_args}".strip()
    memory = [
        Row(
            f"HF GPT-2 small, per-device peak memory, S = {S}, {how}",
            figure_named(f"peak_mib_S{S}_{key}"),
            "MiB",
            None,
            command,
        )
        for key, how in (("full", "full fine-tuning"), ("lora", "LoRA r = 8"))
        for S in (1, 2, 4)
    ]
    name = "HF GPT-2 small, split step S = {0}, m = {0} vs the un-split HF model"
    ratio = [Row(name.format(S), figure_named(f"step_ratio_split_vs_hf_S{S}_m{S}"), "x", None, command) for S in (1, 2)]
    return memory + ratio


def gpu_rows() -> list[Row]:
    """GPU speedups over the CPU (reported, not required: they need a CUDA GPU)."""
    return [
        Row(
            "GPU: server decoder step, transformer_small translation, vs CPU on 2 threads",
            lambda f: f.get("decoder_step_gpu_speedup"),
            "x",
            20.0,
            "python benchmarks/gpu_speedup.py --round (needs a CUDA GPU)",
            False,
        ),
        Row(
            "GPU: server decoder step, transformer_paper translation, vs CPU on 2 threads",
            lambda f: f.get("paper_decoder_step_gpu_speedup"),
            "x",
            None,
            "python benchmarks/gpu_speedup.py --round (needs a CUDA GPU)",
            False,
        ),
        Row(
            "GPU: server head step, bert_base classification, vs CPU on 2 threads",
            lambda f: f.get("bert_head_step_gpu_speedup"),
            "x",
            None,
            "python benchmarks/gpu_speedup.py --round (needs a CUDA GPU)",
            False,
        ),
        Row(
            "GPU: federated round from the third on, 2 CUs, 20 local steps, vs CPU",
            lambda f: f.get("round_gpu_speedup"),
            "x",
            5.0,
            "python benchmarks/gpu_speedup.py --round (needs a CUDA GPU)",
            False,
        ),
        Row(
            "GPU: pipeline step in those rounds, vs CPU",
            lambda f: f.get("step_gpu_speedup"),
            "x",
            None,
            "python benchmarks/gpu_speedup.py --round (needs a CUDA GPU)",
            False,
        ),
    ]
