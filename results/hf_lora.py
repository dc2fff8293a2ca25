"""LoRA against full fine-tuning of a Hugging Face causal LM in a real federated run (issue 29): perplexity per
round, what each CU uploads per round, and DSSRA's plans.

Two ``collapipe run`` jobs (the Flower simulation, as a user starts it) with ``task=causal_lm`` and the default
``model=gpt2_tiny`` (a GPT-2 built from its config: L = 4 TEBs, H = 64, a 2000-token byte-level BPE trained on
the Multi30K English side; nothing downloaded), N = 2 clusters (``federation=small``) for ``ROUNDS`` rounds of
``STEPS`` local steps, seed 0, validation perplexity after every round and before the first: once with
``model.lora.enabled=true`` (r = 4 adapters on every TEB's c_attn / c_proj; the CUs upload theta^s_LoRA only)
and once ``false`` (the CUs upload the embedding and every TEB weight, eq. 4).

From each run folder's ``rounds.jsonl``: ``val_perplexity`` per evaluated round; per CU and round the bytes of
the tensors in its reply (``clients.<n>.upload-bytes``, measured on the CU) and the uplink DSSRA planned with
(``modelled.uplink_bits``: eq. 11's D_n, z_enc of every local step plus the model upload); per round the plan
X(t) per cluster n (S_n, m_n, delta_n). Each job is skipped when its folder already has ``summary.json``
(``results/campaign.py``) and started again when an interrupted one left its folder without it (set aside as
``<job>.unfinished``), so the script resumes after an interruption; ``--report`` only rebuilds the README
(``results/hf_lora/README.md``). Usage: ``python results/hf_lora.py ROOT [--report]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import modelled, read_jsonl  # noqa: E402

OUT = Path(__file__).resolve().parent / "hf_lora"
ROUNDS, STEPS, SEED = 5, 20, 0
FLAT = "task='causal_lm'"
COMMON = (
    f"federation=small federation.num_rounds={ROUNDS} federation.local_steps={STEPS} "
    f"eval.every=1 eval.at_start=true seed={SEED} checkpoint=false"
)
JOBS = {"lora": "model.lora.enabled=true", "full": "model.lora.enabled=false"}


def overrides(name: str) -> str:
    return f"{COMMON} {JOBS[name]}"


def command(root: Path, name: str) -> str:
    """The ``collapipe run`` line ``campaign.run_job`` starts for job ``name``."""
    return (
        f"collapipe run --run-config \"{FLAT} output-dir='{root}' run-name='{name}'\" "
        f"--run-config 'overrides=\"{overrides(name)}\"'"
    )


def records(folder: Path) -> list[dict] | None:
    """The run's rounds.jsonl records, or None when it has not finished."""
    if not (folder / "summary.json").is_file():
        return None
    return read_jsonl(folder / "rounds.jsonl")


def plan_cells(record: dict) -> str:
    """X(t) per cluster n: 'n: S=.., m=.., delta=[..]' (or 'n: not selected')."""
    cells = []
    for c in (record.get("plan") or {}).get("clusters", []):
        if not c.get("selected", True):
            cells.append(f"{c['cluster']}: not selected")
            continue
        cells.append(f"{c['cluster']}: S={c['S']}, m={c['m']}, delta={c['delta']}")
    return "; ".join(cells)


def uploads(record: dict) -> list[int | None]:
    """Per CU (by cluster id) the bytes its reply carried this round (None: not recorded)."""
    clients = record.get("clients") or {}
    return [clients[n].get("upload-bytes") for n in sorted(clients, key=int)]


def perplexity_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = md.head("| round | LoRA perplexity | full fine-tuning perplexity |")
    by_round = {name: {r["round"]: r.get("val_perplexity") for r in recs} for name, recs in runs.items()}
    for t in sorted(set().union(*(b.keys() for b in by_round.values()))):
        cells = [by_round[name].get(t) for name in JOBS]
        lines.append(md.row((t, *("-" if v is None else f"{v:.1f}" for v in cells))))
    return lines


def _number(value: int | float | None) -> str:
    return "not recorded" if value is None else f"{value:,.0f}"


def paired_rounds(runs: dict[str, list[dict]]) -> list[tuple[int, dict, dict]]:
    """(t, the LoRA run's record of round t, the full run's) for every trained round either has ({} where one has
    none)."""
    lora = {r["round"]: r for r in runs["lora"] if r["round"] > 0}
    full = {r["round"]: r for r in runs["full"] if r["round"] > 0}
    return [(t, lora.get(t, {}), full.get(t, {})) for t in sorted(set(lora) | set(full))]


UPLOAD_HEAD = (
    *md.head(
        "| round | LoRA: bytes per CU (CU 0 / CU 1) | full: bytes per CU | full / LoRA | "
        "planned uplink bits per CU, LoRA / full (eq. 11) |"
    ),
)
PLAN_HEAD = (
    *md.head(
        "| round | LoRA plan (cluster: S, m, delta) | full fine-tuning plan | same plan | same S, m | "
        "modelled round delay (eq. 26), LoRA / full |"
    ),
)


def upload_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = list(UPLOAD_HEAD)
    for t, lora, full in paired_rounds(runs):
        up_l, up_f = uploads(lora), uploads(full)
        ratio = "-"
        if up_l and up_f and None not in up_l + up_f:
            ratio = f"{min(up_f) / max(up_l):.1f}x"  # type: ignore[type-var, operator]
        bits = [plan.uplink_bits if (plan := modelled(r)) else None for r in (lora, full)]
        lines.append(
            f"| {t} | {' / '.join(_number(u) for u in up_l)} | {' / '.join(_number(u) for u in up_f)} | {ratio} | "
            f"{_number(bits[0])} / {_number(bits[1])} |"
        )
    return lines


def s_and_m(record: dict) -> list[tuple[int, int]]:
    """(S_n, m_n) of every cluster n in the round's plan."""
    return [(int(c["S"]), int(c["m"])) for c in (record.get("plan") or {}).get("clusters", [])]


def plan_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = list(PLAN_HEAD)
    for t, a, b in paired_rounds(runs):
        same = "yes" if plan_cells(a) == plan_cells(b) else "no"
        same_sm = "yes" if s_and_m(a) == s_and_m(b) else "no"
        delays = [plan.round_delay_s if (plan := modelled(r)) else float("nan") for r in (a, b)]
        delay = " / ".join(f"{d:.1f} s" for d in delays)
        lines.append(f"| {t} | {plan_cells(a) or '-'} | {plan_cells(b) or '-'} | {same} | {same_sm} | {delay} |")
    return lines


def findings(runs: dict[str, list[dict]]) -> list[str]:
    """The three checks in words: LoRA's perplexity falls, its upload is >= 20x smaller, the plans differ."""
    ppl = [r["val_perplexity"] for r in runs["lora"] if "val_perplexity" in r]
    full_ppl = [r["val_perplexity"] for r in runs["full"] if "val_perplexity" in r]
    up_l = [u for r in runs["lora"] for u in uploads(r) if u is not None]
    up_f = [u for r in runs["full"] if r["round"] > 0 for u in uploads(r) if u is not None]
    ratio = min(up_f) / max(up_l) if up_l and up_f else None
    pairs = list(zip([r for r in runs["lora"] if r["round"] > 0], [r for r in runs["full"] if r["round"] > 0]))
    differ = sum(plan_cells(a) != plan_cells(b) for a, b in pairs)
    differ_sm = sum(s_and_m(a) != s_and_m(b) for a, b in pairs)
    falls = len(ppl) > 1 and ppl[-1] < ppl[0]
    steps_down = sum(b < a for a, b in zip(ppl, ppl[1:]))
    out = [
        f"- LoRA's validation perplexity {'falls' if falls else 'does NOT fall'}: {ppl[0]:.1f} before training, "
        f"{ppl[-1]:.1f} after round {len(ppl) - 1}, lower than the round before in {steps_down} of {len(ppl) - 1} "
        f"rounds (full fine-tuning: {full_ppl[0]:.1f} -> {full_ppl[-1]:.1f}).",
        "- Upload per CU per round: "
        + (
            "not recorded."
            if ratio is None
            else f"{max(up_l):,} bytes with LoRA against {min(up_f):,} with full fine-tuning, {ratio:.1f}x smaller "
            f"({'meets' if ratio >= 20 else 'misses'} >= 20x)."
        ),
        f"- DSSRA's plans differ in {differ} of {len(pairs)} rounds (S_n, m_n differ in {differ_sm}).",
    ]
    for name, recs in runs.items():  # a CU that failed a round (e.g. killed for memory) makes the runs unequal
        failed = [f"round {r['round']} CU {f['cluster']}" for r in recs for f in r.get("failures") or []]
        if failed:
            out.append(f"- **{name}: CUs failed** ({', '.join(failed)}); the rounds are not comparable.")
    return out


def report(root: Path) -> str:
    runs = {name: records(root / name) for name in JOBS}
    missing = [name for name, recs in runs.items() if recs is None]
    head = [
        "# LoRA vs full fine-tuning of a causal LM in a federated run (results/hf_lora.py)",
        "",
        "`python results/hf_lora.py ROOT` runs the two jobs below into `ROOT/<job>/` (skipping finished ones) and "
        "writes this file from their `rounds.jsonl`. The jobs (the Flower simulation, `collapipe run`):",
        "",
        "```bash",
        *(command(Path("ROOT"), name) for name in JOBS),
        "```",
        "",
    ]
    if missing:
        return "\n".join([*head, f"Not finished yet: {', '.join(missing)}.", ""])
    done: dict[str, list[dict]] = {name: recs for name, recs in runs.items() if recs is not None}
    body = [
        "task `causal_lm`, model `gpt2_tiny` from scratch (L = 4 TEBs, H = 64, vocabulary 2000; LoRA r = 4 on c_attn, "
        f"c_proj), N = 2 clusters, {ROUNDS} rounds of {STEPS} local steps, seed {SEED}, network `small`, scheduler "
        "DSSRA. Perplexity on the 1014 Multi30K validation lines (English side); round 0 is the untrained model.",
        "",
        *findings(done),
        "",
        "## Validation perplexity per round",
        "",
        *perplexity_table(done),
        "",
        "## Upload per CU per round",
        "",
        "Bytes of the tensors in each CU's reply (`clients.<n>.upload-bytes`, measured on the CU; full fine-tuning: "
        "the embedding and every TEB weight, LoRA: the adapters of every delta_k). DSSRA's planned uplink "
        "(`modelled.uplink_bits`, eq. 11's D_n) also holds z_enc of every local step, the same in both runs.",
        "",
        *upload_table(done),
        "",
        "## DSSRA's plans X(t)",
        "",
        *plan_table(done),
        "",
    ]
    return "\n".join([*head, *body])


def set_aside(folder: Path) -> None:
    """A run folder an interrupted job left without ``summary.json`` (``checkpoint=false``: nothing to resume) is
    renamed ``<name>.unfinished`` (replacing an older one), so the job starts again instead of being refused."""
    if folder.is_dir() and not (folder / "summary.json").is_file():
        aside = folder.with_name(folder.name + ".unfinished")
        if aside.is_dir():
            shutil.rmtree(aside)
        folder.rename(aside)
        print(f"job {folder.name}: an unfinished run folder moved to {aside}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of the two run folders (outside the repository)")
    parser.add_argument("--report", action="store_true", help="only rebuild the README from the finished runs")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    failed = 0
    if not args.report:
        for name in JOBS:
            set_aside(root / name)
            failed += not campaign.run_job(root, name, overrides(name), flat=FLAT)
    text = report(root)
    md.write(OUT / "README.md", text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
