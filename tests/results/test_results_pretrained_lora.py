"""results/pretrained_lora/README.md is what results/pretrained_lora.py makes of the kept records; the central run's
training examples are derived from the federated run's config; the report builder (results/pretrained_lora_tables.py)
on hand-built records."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.results_scripts import load

OUT = ROOT / "results" / "pretrained_lora"
TINY = ["task=causal_lm", "model=llama_tiny", "federation=small", "federation.num_rounds=3", "federation.local_steps=8"]


def _module():
    return load("pretrained_lora")


def _tables(monkeypatch, out: Path):
    """The report's module (results/pretrained_lora_tables.py) reading its records from ``out``."""
    tables = sys.modules[_module().report.__module__]
    monkeypatch.setattr(tables, "OUT", out)
    return tables


def test_the_committed_readme_is_regenerated_from_the_kept_records():
    committed = (OUT / "README.md").read_text(encoding="utf-8")
    assert _module().report() == committed, "results/pretrained_lora/README.md differs: run its --report"


def test_central_sees_as_many_examples_as_the_federated_run():
    from collapipe_flwr.config import load_run_config

    mod = _module()
    cfg = load_run_config(TINY)
    b = cfg.task.batch_size
    # 3 rounds x min(N = 3 clusters, J = 2 channels) x 8 local steps x b
    equal_examples = sys.modules[mod.report.__module__].equal_examples  # results/pretrained_lora_tables.py
    assert equal_examples(cfg) == 3 * 2 * 8 * b
    assert mod.central_steps(cfg) == 3 * 2 * 8
    one = load_run_config([*TINY, "federation.num_clusters=1"])  # fewer CUs than channels: all of them train
    assert equal_examples(one) == 3 * 1 * 8 * b
    # the preset the script runs: 768 examples (issue 66: the federated run saw 768, central 384 before)
    assert equal_examples(mod.federated_config()) == 768
    assert mod.central_steps(mod.federated_config()) == 48


def test_the_warmup_takes_the_captions_after_the_scored_ones():
    mod = _module()
    val = [f"caption {i}" for i in range(mod.EVAL + mod.WARMUP_STEPS * 4 + 5)]
    lines = mod.warmup_lines(val, 4)
    assert lines == val[mod.EVAL : mod.EVAL + mod.WARMUP_STEPS * 4]
    with pytest.raises(SystemExit, match="fewer than"):
        mod.warmup_lines(val[: mod.EVAL + 3], 4)


def _write(out: Path, name: str, record) -> None:
    (out / name).write_text(json.dumps(record, default=str))


def _hand_built_records(out: Path, cfg) -> None:
    """Two seeds of every side, the base, the int8 pair, memory and samples: round numbers a reader checks by eye."""
    ppl = {"warmup": (120.0, 130.0), "central": (48.0, 52.0), "federated": (49.0, 51.0)}
    _write(out, "base.scores.json", {"fp32": {"perplexity": 300.0}, "bf16": {"perplexity": 310.0}})
    for seed in (0, 1):
        for prefix, values in ppl.items():
            fp32 = values[seed]
            _write(
                out,
                f"{prefix}_s{seed}.scores.json",
                {"fp32": {"perplexity": fp32}, "bf16": {"perplexity": fp32 * 1.03}},
            )
        _write(out, f"central_s{seed}.json", {"examples": 768, "wall_s": 200.0})
        _write(out, f"warmup_s{seed}.json", {"examples": 128, "wall_s": 60.0})
        _write(out, f"federated_s{seed}.summary.json", {"wall_s": 900.0, "peak_pss_mb": 4000.0})
        _write(out, f"federated_s{seed}.config.json", cfg.to_dict())
        plan = {"clusters": [{"cluster": c, "S": 2, "m": 8, "delta": [15, 15], "selected": True} for c in (1, 2)]}
        clients = {str(c): {"num-examples": 128, "upload-bytes": 3686400} for c in (1, 2)}
        rounds = [{"round": 0, "val_perplexity": 300.0}] + [
            {"round": t, "val_perplexity": 100.0 / t, "clients": clients, "plan": plan} for t in (1, 2, 3)
        ]
        with gzip.open(out / f"federated_s{seed}.rounds.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rounds)
    _write(out, "central.json", {"val": {"perplexity": 50.0}})
    _write(out, "central_int8.json", {"val": {"perplexity": 51.0}})
    row = {"delta": [30], "peak_mib": 100.0, "params_mib": 10.0, "grads_mib": 1.0, "optim_mib": 2.0, "act_mib": 80.0}
    _write(
        out,
        "memory.json",
        {k: {S: row for S in ("1", "2", "4")} for k in ("lora_bf16_base", "lora_int8_base", "full_fp32")},
    )
    _write(out, "samples.json", [{"prompt": "a man", "base": " who", "federated": " in a hat ."}])


def test_the_report_is_built_from_hand_built_records(tmp_path, monkeypatch):
    from collapipe_flwr.config import load_run_config

    mod = _tables(monkeypatch, tmp_path)
    cfg = load_run_config(TINY)
    b = cfg.task.batch_size
    _hand_built_records(tmp_path, cfg)
    text = mod.report()
    # one row a model: examples, the seeds kept, fp32 and bf16 spreads (mean +- sample sd (min-max))
    assert "| pretrained base, untrained (LoRA B = 0) | 0 | (none) | 300.00 | 310.00 |" in text
    assert f"| {3 * 2 * 8 * b} | 0, 1 | 50.00 +- 1.41 (49.00-51.00) | 51.50 +- 1.46 (50.47-52.53) |" in text
    assert (
        f"central LoRA, 48 steps on the training split | {3 * 2 * 8 * b} | 0, 1 | 50.00 +- 2.83 (48.00-52.00)" in text
    )
    assert f"validation captions {mod.EVAL + 1}-{mod.EVAL + mod.WARMUP_STEPS * b} | {mod.WARMUP_STEPS * b} |" in text
    # the derivation from the kept config, and the counts in the records
    assert f"3 x 2 x 8 x {b} = {3 * 2 * 8 * b}" in text and "federated [768, 768]" in text
    # the verdicts, on the fp32 means: 50 / 300 -> 83.3% below; 50 / 50 -> +0.0% (two-sided)
    assert "federated LoRA 83.3% below the base (target >= 20%: met)" in text
    assert "federated +0.0% against central at equal examples (target within +-5%, two-sided: met)" in text
    assert "the 8-step warm-up alone is 58.3% below the base" in text
    assert "bf16 autocast against fp32 on the same weights: base +3.3%, warm-up +3.0%" in text
    assert "int8 base 51.00, +2.0% (target within 3%: met)" in text
    assert "| 1 | 130.00 | 52.00 | 51.00 | 100.00, 50.00, 33.33 | 60.0, 200.0, 900.0 | 4000.0 |" in text
    assert text.count("Verdict rule") == 1


def test_a_side_not_run_yet_leaves_the_targets_unjudged(tmp_path, monkeypatch):
    from collapipe_flwr.config import load_run_config

    mod = _tables(monkeypatch, tmp_path)
    _hand_built_records(tmp_path, load_run_config(TINY))
    for seed in (0, 1):
        (tmp_path / f"federated_s{seed}.scores.json").unlink()
    # issue 46's federated record: scored only under bf16 autocast, one seed; shown, never judged
    clients = {str(c): {"num-examples": 128} for c in (1, 2)}
    rounds = [{"round": 0, "val_perplexity": 300.0}] + [
        {"round": t, "val_perplexity": 60.0, "clients": clients} for t in (1, 2, 3)
    ]
    with gzip.open(tmp_path / "federated.rounds.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rounds)
    text = mod.report()
    assert "(not run yet)" in text and "Targets: judged once every side has a kept seed." in text
    assert "| 768 | 0 | (not scored) | 60.00 |" in text
    # against central's bf16 mean (48 x 1.03 and 52 x 1.03: 51.50): 60 / 51.5 - 1
    assert "at equal examples: +16.5% (no verdict: not fp32, one seed)" in text


def test_the_checkpoint_rows_pair_each_lora_variant_with_full_fine_tuning_with_and_without_it(tmp_path, monkeypatch):
    """issue 66: pipeline.checkpoint=always variants, shown once all three are measured; ratios by hand: full
    fine-tuning 100 MiB without re-materialization (m = S) and 60 MiB with it, LoRA 40 (bf16) and 20 (int8)."""
    from collapipe_flwr.config import load_run_config

    mod = _tables(monkeypatch, tmp_path)
    _hand_built_records(tmp_path, load_run_config(TINY))
    assert "re-materialization" not in mod.report()  # not measured yet: no table
    memory = json.loads((tmp_path / "memory.json").read_text())
    for name, peak in (("lora_bf16_base", 40.0), ("lora_int8_base", 20.0), ("full_fp32", 60.0)):
        row = {"delta": [30], "peak_mib": peak, "params_mib": 1.0, "grads_mib": 1.0, "optim_mib": 1.0, "m": 8}
        memory[f"{name}_checkpoint"] = {S: {**row, "act_mib": peak / 2} for S in ("1", "2", "4")}
    _write(tmp_path, "memory.json", memory)
    text = mod.report()
    assert "(`pipeline.checkpoint=always`, m = 8 micro-batches)" in text
    assert "| 1 | 40 | 20 | 60 | 20, 10, 30 | 2.50x (met) / 1.50x (missed) | 5.00x (met) / 3.00x (missed) |" in text
    assert {f"{name}_checkpoint" for name in ("lora_bf16_base", "lora_int8_base", "full_fp32")} <= set(
        _module().VARIANTS
    )
