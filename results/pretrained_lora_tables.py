"""The report of results/pretrained_lora.py: ``README.md`` of ``results/pretrained_lora/`` from its kept records only,
and the settings both share (the runs' sizes, the seeds, how many examples each side trains on)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/reportlib, run as a script or loaded by path
from reportlib import markdown as md  # noqa: E402
from reportlib.records import read_json, read_jsonl_gz  # noqa: E402
from reportlib.stats import mean_sd  # noqa: E402

OUT = Path(__file__).resolve().parent / "pretrained_lora"
ROUNDS, STEPS, EVAL, SEED = 3, 8, 256, 0
SEEDS = (0, 1, 2)
WARMUP_STEPS = 8
SEGMENTS = (1, 2, 4)
NEW_TOKENS = 20
MODEL = "model=smollm2_135m"
FEDERATED = (
    f"{MODEL} federation=small federation.num_rounds={ROUNDS} federation.local_steps={STEPS} eval.every=1 "
    f"eval.at_start=true eval.max_examples={EVAL} checkpoint=false"
)


def federated_overrides(seed: int) -> str:
    return f"{FEDERATED} seed={seed} eval.precision=fp32"


def federated_config(seed: int = SEED):
    """The federated run's typed config (``collapipe run`` adds only output folders and run names to it)."""
    from collapipe_flwr.config import load_run_config

    return load_run_config(["task=causal_lm", *federated_overrides(seed).split()])


def equal_examples(cfg) -> int:
    """Training examples the federated run of run config ``cfg`` trains on: every round, min(N, J) CUs (one per
    channel, DSSRA's selection) each take ``local_steps`` steps of ``task.batch_size`` examples."""
    selected = min(cfg.federation.num_clusters, cfg.network.num_channels)
    return cfg.federation.num_rounds * selected * cfg.federation.local_steps * cfg.task.batch_size


def central_steps(cfg) -> int:
    """Central steps at the federated run's batch size for :func:`equal_examples` of ``cfg`` (a whole number)."""
    examples, batch = equal_examples(cfg), cfg.task.batch_size
    if examples % batch:
        raise SystemExit(f"{examples} examples are no whole number of batches of {batch}")
    return examples // batch


# ----------------------------------------------------------------------------- the report, from records only
ROWS = (  # the comparison's models: (record name prefix, what the row says)
    ("warmup", "format-only warm-up: central LoRA, {warmup} steps on validation captions {first}-{last}"),
    ("central", "central LoRA, {central} steps on the training split"),
    ("federated", "federated LoRA, {rounds} rounds x {steps} local steps, {selected} of {clusters} CUs a round"),
)


def record(name: str) -> dict | None:
    """The kept JSON record ``name`` (without .json), None when it is not there (yet)."""
    path = OUT / f"{name}.json"
    return read_json(path) if path.is_file() else None


def seeds_of(prefix: str) -> list[int]:
    """The seeds whose ``<prefix>_s<seed>.scores.json`` is kept."""
    return [seed for seed in SEEDS if (OUT / f"{prefix}_s{seed}.scores.json").is_file()]


def perplexities(prefix: str, precision: str) -> list[float]:
    """The ``precision`` perplexity of each kept seed of ``prefix`` (``base``: its one scoring)."""
    names = ["base"] if prefix == "base" else [f"{prefix}_s{seed}" for seed in seeds_of(prefix)]
    return [record(f"{name}.scores")[precision]["perplexity"] for name in names]  # type: ignore[index]


def spread(values: list[float]) -> str:
    """mean +- sample sd (min-max) of ``values``; one value alone."""
    if not values:
        return "(not run yet)"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    mean, sd = mean_sd(values)
    return f"{mean:.2f} +- {sd:.2f} ({min(values):.2f}-{max(values):.2f})"


def kept_config():
    """The typed run config of the first kept federated record (its config.json); before any, the config the
    script runs it with."""
    from collapipe_flwr.config import RunConfig

    for seed in SEEDS:
        kept = record(f"federated_s{seed}.config")
        if kept is not None:
            return RunConfig.from_dict(kept)
    return federated_config()


def examples_lines(cfg) -> list[str]:
    """How many training examples each side saw: derived from the kept config, then counted in the records."""
    fed = cfg.federation
    selected = min(fed.num_clusters, cfg.network.num_channels)
    counted = [
        sum(c.get("num-examples", 0) for r in read_jsonl_gz(OUT / f"federated_s{seed}.rounds.jsonl.gz")
            for c in (r.get("clients") or {}).values())
        for seed in seeds_of("federated")
    ]  # fmt: skip
    central = [record(f"central_s{seed}")["examples"] for seed in seeds_of("central")]  # type: ignore[index]
    warmup = [record(f"warmup_s{seed}")["examples"] for seed in seeds_of("warmup")]  # type: ignore[index]
    return [
        f"Training examples, equal on both sides: the federated run's config gives T x min(N, J) x local steps x b = "
        f"{fed.num_rounds} x {selected} x {fed.local_steps} x {cfg.task.batch_size} = {equal_examples(cfg)} "
        f"(`equal_examples`); counted in the records: federated {counted} (the CUs' num-examples over the rounds), "
        f"central {central} (steps x b), format warm-up {warmup}.",
    ]


def comparison_lines() -> list[str]:
    """The table of base, warm-up, central and federated perplexities (fp32 and bf16) and the targets' verdicts."""
    cfg = kept_config()
    fed = cfg.federation
    b = cfg.task.batch_size
    words = {
        "warmup": WARMUP_STEPS, "first": EVAL + 1, "last": EVAL + WARMUP_STEPS * b, "central": central_steps(cfg),
        "rounds": fed.num_rounds, "steps": fed.local_steps, "clusters": fed.num_clusters,
        "selected": min(fed.num_clusters, cfg.network.num_channels),
    }  # fmt: skip
    lines = [
        f"Validation perplexity on the first {EVAL} Multi30K English captions (lower is better), every model scored",
        "by the same call (`apps.evaluate.evaluate_model`, the server's validation) in plain fp32 and under bf16",
        "autocast; over seeds: mean +- sample sd (min-max). The frozen base is stored in bf16 in every row (the",
        "runs' `model.base_dtype`), so fp32 scoring computes in fp32 on bf16-rounded base weights.",
        "",
        *md.head("| model | training examples | seeds | perplexity, fp32 | perplexity, bf16 autocast |"),
        f"| pretrained base, untrained (LoRA B = 0) | 0 | (none) | {spread(perplexities('base', 'fp32'))} | "
        f"{spread(perplexities('base', 'bf16'))} |",
    ]
    counts = {"warmup": WARMUP_STEPS * b, "central": equal_examples(cfg), "federated": equal_examples(cfg)}
    for prefix, what in ROWS:
        lines.append(
            f"| {what.format(**words)} | {counts[prefix]} | {', '.join(map(str, seeds_of(prefix))) or '-'} | "
            f"{spread(perplexities(prefix, 'fp32'))} | {spread(perplexities(prefix, 'bf16'))} |"
        )
    old = issue46_federated()
    if old is not None:
        lines.append(
            f"| federated LoRA, issue 46's record (`federated.*`: the same settings, seed {SEED}, its config not kept) "
            f"| {old[1]} | {SEED} | (not scored) | {old[0]:.2f} |"
        )
    return [*lines, "", *examples_lines(cfg), "", *target_lines()]


def issue46_federated() -> tuple[float, int] | None:
    """Issue 46's kept federated record (scored only under its bf16 autocast): (final perplexity, examples)."""
    path = OUT / "federated.rounds.jsonl.gz"
    if not path.is_file():
        return None
    rounds = read_jsonl_gz(path)
    examples = sum(c.get("num-examples", 0) for r in rounds for c in (r.get("clients") or {}).values())
    return rounds[-1]["val_perplexity"], examples


def target_lines() -> list[str]:
    """The verdicts, on the fp32 means over seeds."""
    mean = {p: mean_sd(perplexities(p, "fp32"))[0] for p in ("base", "warmup", "central", "federated")}
    if any(v != v for v in mean.values()):  # nan: a side not run yet
        lines = ["Targets: judged once every side has a kept seed."]
        old, central = issue46_federated(), mean_sd(perplexities("central", "bf16"))[0]
        if old is not None and central == central:
            lines.append(
                f"Meanwhile, issue 46's federated record (bf16 autocast, one seed) against central's bf16 mean at "
                f"equal examples: {old[0] / central - 1.0:+.1%} (no verdict: not fp32, one seed)."
            )
        return lines
    below = 1.0 - mean["federated"] / mean["base"]
    within = mean["federated"] / mean["central"] - 1.0
    fed, cen = perplexities("federated", "fp32"), perplexities("central", "fp32")
    overlap = max(min(fed), min(cen)) <= min(max(fed), max(cen))
    return [
        "On the fp32 means:",
        "",
        f"- federated LoRA {below:.1%} below the base (target >= 20%: {'met' if below >= 0.20 else 'missed'});",
        f"- federated {within:+.1%} against central at equal examples (target within +-5%, two-sided: "
        f"{'met' if abs(within) <= 0.05 else 'missed'}); the seeds' ranges "
        f"{'overlap' if overlap else 'do not overlap'};",
        f"- learning the format against learning the data: the {WARMUP_STEPS}-step warm-up alone is "
        f"{1.0 - mean['warmup'] / mean['base']:.1%} below the base; from the warm-up, central goes "
        f"{1.0 - mean['central'] / mean['warmup']:.1%} and federated {1.0 - mean['federated'] / mean['warmup']:.1%} "
        "further down.",
        "",
        "bf16 autocast against fp32 on the same weights: "
        + ", ".join(
            f"{p.replace('warmup', 'warm-up')} {mean_sd(perplexities(p, 'bf16'))[0] / mean[p] - 1.0:+.1%}"
            for p in ("base", "warmup", "central", "federated")
        )
        + " (mean over seeds).",
    ]


def seed_lines() -> list[str]:
    """Per seed: each model's fp32 perplexity, the federated rounds' fp32 curve and the runs' wall seconds."""
    lines = [
        "",
        "Per seed (fp32 perplexity; federated rounds from the run's own evaluation, `eval.precision=fp32`; wall",
        "seconds of each run, start-up and evaluation included, on this shared 2-core machine):",
        "",
        *md.head(
            "| seed | warm-up | central | federated | federated after rounds 1, 2, 3 | wall s: warm-up, central, "
            "federated | federated peak memory (PSS, MB) |"
        ),
    ]
    for seed in SEEDS:
        names = [f"{p}_s{seed}" for p in ("warmup", "central", "federated")]
        scores = [record(f"{n}.scores") for n in names]
        if not any(scores):
            continue
        ppl = [f"{s['fp32']['perplexity']:.2f}" if s else "-" for s in scores]
        summary = record(f"federated_s{seed}.summary")
        curve = "-"
        if summary:
            rounds = read_jsonl_gz(OUT / f"federated_s{seed}.rounds.jsonl.gz")
            curve = ", ".join(f"{r['val_perplexity']:.2f}" for r in rounds if r["round"] > 0)
        walls = [(record(n) or {}).get("wall_s", "-") for n in names[:2]] + [(summary or {}).get("wall_s", "-")]
        peak = (summary or {}).get("peak_pss_mb", "-")
        lines.append(f"| {seed} | {' | '.join(ppl)} | {curve} | {', '.join(map(str, walls))} | {peak} |")
    return lines


def int8_lines() -> list[str]:
    """Issue 46/66's int8-base row: central LoRA, ROUNDS x STEPS steps, seed 0, under the run's bf16 autocast."""
    central = record("central")["val"]["perplexity"]  # type: ignore[index]
    int8 = record("central_int8")["val"]["perplexity"]  # type: ignore[index]
    change = int8 / central - 1.0
    return [
        "",
        f"Quantized base (issue 66; `central.json`, `central_int8.json`: central LoRA, {ROUNDS * STEPS} steps, seed "
        f"{SEED}, scored under the run's bf16 autocast): bf16 base {central:.2f}, int8 base {int8:.2f}, {change:+.1%} "
        f"(target within 3%: {'met' if abs(change) <= 0.03 else 'missed'}).",
        "",
        "Superseded records: issue 46's single-seed federated run (`federated.rounds.jsonl.gz`, "
        "`federated.summary.json`:",
        "scored only under bf16 autocast, its config not kept) is kept beside as its own labelled row; "
        "`federated_s<seed>.*` supersede it;",
        f"its `central.json` ({ROUNDS * STEPS} steps, as many as the federated global model's averaged updates, "
        "not as many examples)",
        "is kept only as the int8 pair's reference.",
    ]


def memory_table(memory: dict) -> list[str]:
    """The per-device peak memory of each LoRA variant against fp32 full fine-tuning, per S."""
    lines = [
        "",
        "Per-device peak memory of one pipeline step (the device holding the most; MiB; params + gradients + Adam",
        "state + saved activations, from the real tensors), balanced segments; ratio = full fine-tuning / LoRA:",
        "",
        *md.head(
            "| S | delta | LoRA, bf16 base | LoRA, int8 base | full fine-tuning, fp32 "
            "| ratio, bf16 base (target >= 2x) "
            "| ratio, int8 base (target >= 3.5x) |"
        ),
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


def checkpoint_table(memory: dict) -> list[str]:
    """The same three models with GPipe's re-materialization (``pipeline.checkpoint=always``), when measured: each
    LoRA variant's ratio against full fine-tuning without it (the table above's) and with it (the fair pairing)."""
    names = ("lora_bf16_base", "lora_int8_base", "full_fp32")
    if not all(f"{name}_checkpoint" in memory for name in names):
        return []
    m = memory["full_fp32_checkpoint"][str(SEGMENTS[0])].get("m")
    lines = [
        "",
        f"The same with re-materialization (`pipeline.checkpoint=always`, m = {m} micro-batches): a stage keeps only",
        "each micro-batch's segment input and recomputes its forward in the backward (about one extra forward per",
        "micro-batch), so its saved activations are the inputs plus one micro-batch's, recomputed (counted at the",
        "backward's peak); ratios of full fine-tuning without re-materialization (the table above, m = S) and with",
        "it (this table) to each LoRA variant with it:",
        "",
        *md.head(
            "| S | LoRA, bf16 base | LoRA, int8 base | full fine-tuning, fp32 | activations (bf16, int8, full) "
            "| bf16 base: vs full / vs full re-mat. (target >= 2x) "
            "| int8 base: vs full / vs full re-mat. (target >= 3.5x) |"
        ),
    ]
    for S in map(str, SEGMENTS):
        bf16, int8, full = (memory[f"{name}_checkpoint"][S] for name in names)
        plain = memory["full_fp32"][S]["peak_mib"]
        cells = []
        for lora, bound in ((bf16, 2.0), (int8, 3.5)):
            ratios = (plain / lora["peak_mib"], full["peak_mib"] / lora["peak_mib"])
            cells.append(" / ".join(f"{r:.2f}x ({'met' if r >= bound else 'missed'})" for r in ratios))
        acts = ", ".join(f"{r['act_mib']:.0f}" for r in (bf16, int8, full))
        lines.append(
            f"| {S} | {bf16['peak_mib']:.0f} | {int8['peak_mib']:.0f} | {full['peak_mib']:.0f} | {acts} | "
            f"{cells[0]} | {cells[1]} |"
        )
    return lines


def report() -> str:
    memory = read_json(OUT / "memory.json")
    samples = read_json(OUT / "samples.json")
    lines = [
        "# Federated LoRA on a pretrained LLM (SmolLM2-135M-Instruct), issues 46 and 66",
        "",
        "Generated by `python results/pretrained_lora.py ROOT --report` from the records in this folder; how they",
        "were made: the script's docstring. Verdict rule (stated once): a target is **met** when the measured",
        'figure is on its side of the bound (a "within" bound on both sides), else **missed**.',
        "",
        *comparison_lines(),
        *seed_lines(),
        *_round_lines(),
        *int8_lines(),
        *memory_table(memory),
        *checkpoint_table(memory),
    ]
    lines += [
        "",
        f"Greedy continuations ({NEW_TOKENS} new tokens) of validation captions' first words by the base and by the "
        "federated",
        "model (`samples.json`, kept from issue 46's seed-0 run):",
        "",
    ]
    for row in samples:
        lines += [f"- prompt `{row['prompt']}`", f"  - base: {row['base']!r}", f"  - federated: {row['federated']!r}"]
    return "\n".join(lines) + "\n"


def _round_lines() -> list[str]:
    """Per federated round of each kept seed: perplexity, each training CU's upload and DSSRA's plan per CU."""
    lines = [
        "",
        "Per round (federated): fp32 perplexity, what each training CU uploaded (bytes of its reply's tensors,",
        "measured on the CU: the adapters only), and DSSRA's plan per selected CU:",
        "",
        *md.head("| seed | round | perplexity | upload bytes per CU | plans (CU: S, m, delta) |"),
    ]
    for seed in seeds_of("federated"):
        for r in read_jsonl_gz(OUT / f"federated_s{seed}.rounds.jsonl.gz"):
            if r["round"] == 0:
                continue
            clients = r.get("clients") or {}
            up = ", ".join(str(clients[n].get("upload-bytes")) for n in sorted(clients, key=int))
            plans = "; ".join(
                f"{c['cluster']}: {c['S']}, {c['m']}, {c['delta']}"
                for c in (r.get("plan") or {}).get("clusters", [])
                if c.get("selected", True)
            )
            lines.append(f"| {seed} | {r['round']} | {r['val_perplexity']:.2f} | {up} | {plans} |")
    return lines
