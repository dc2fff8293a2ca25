"""The virtual-clock results scripts against hand-built records: time to target with censoring
(results/virtual_paper_rows.py), the clock's consistency between jobs (results/clock_consistency.py), the clock's
error against the testbed (results/virtual_clock_tables.py), and the campaign's jobs (results/virtual_paper.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import pytest

from tests.results_scripts import RESULTS, load, modelled_section


def _round(t, round_s, bleu=None, clusters=None):
    record = {"round": t, "virtual": {"round_s": round_s, "clusters": clusters or {}, "slowest": 0}}
    if bleu is not None:
        record["val_bleu"] = bleu
    return record


def test_time_to_target_sums_the_virtual_rounds_up_to_the_first_that_reaches_it():
    tables = load("virtual_paper_rows")
    records = [{"round": 0, "val_bleu": 0.0}, _round(1, 10.0, 2.0), _round(2, 12.5, 11.0), _round(3, 9.0, 12.0)]
    assert tables.time_to_target(records, 10.0) == (22.5, 2, 12.0)  # the last round's BLEU beside it
    # never reached: censored, the sum over every round a lower bound
    assert tables.time_to_target(records, 50.0) == (31.5, None, 12.0)


def test_the_round_by_part_is_the_slowest_clusters_median():
    tables = load("virtual_paper_rows")
    parts = {"compute_s": 1.0, "d2d_s": 0.5, "cu_s": 0.1, "uplink_s": 3.0, "decoder_s": 0.2, "setup_s": 0.0}
    slow = {**parts, "compute_s": 4.0}
    records = [
        {**_round(t, 0.0), "virtual": {"round_s": 0.0, "clusters": {"0": slow, "1": parts}, "slowest": 0}}
        for t in (1, 2, 3)
    ]
    records[0]["modelled"] = modelled_section(5.0, [{"delay_s": 5.0, "compute_s": 3.0, "d2d_s": 1.0, "uplink_s": 1.0}])
    got = tables.round_parts(records)
    assert got["virtual_compute_s"] == 4.0 and got["virtual_uplink_s"] == 3.0
    assert got["modelled_compute_s"] == 3.0


def test_selection_counts_the_plans_selected_cus_by_hand():
    """N = 4, three trained rounds selecting {0, 1}, {0, 2}, {0}: 5/3 a round, 3 of 4 CUs ever, CU 0 in every one."""
    tables = load("virtual_paper_rows")

    def plan(t, chosen):
        clusters = [{"cluster": n, "selected": n in chosen} for n in range(4)]
        return {"round": t, "plan": {"clusters": clusters}}

    records = [{"round": 0}, plan(1, {0, 1}), plan(2, {0, 2}), plan(3, {0})]
    got = tables.selection(records)
    assert got == {"num_clusters": 4, "selected_per_round": 1.667, "cus_ever_selected": 3, "top_cu_share": 1.0}


def test_the_decoder_term_is_grouped_by_each_selected_cu_rounds_planned_m():
    """Round 1: CU 0 at m = 1 (0.5 s), CU 1 at m = 16 (2.0 s), CU 2 not selected (its 9.0 s left out); round 2:
    CU 0 at m = 16 (3.0 s); round 0 (set-up) left out: m = 1 -> [0.5], m = 16 -> [2.0, 3.0]. A VanillaFL job
    (conf/method/vanilla_fl.yaml: head_on_server false; its server does no decoder work, 0 s) adds nothing."""
    rows = load("virtual_paper_rows")

    def record(t, plans, decoder, method="collapipe"):
        clusters = [{"cluster": n, "selected": sel, "m": m} for n, (sel, m) in enumerate(plans)]
        virtual = {"clusters": {str(n): {"decoder_s": d} for n, d in enumerate(decoder)}}
        return {"round": t, "method": method, "plan": {"clusters": clusters}, "virtual": virtual}

    records = [record(0, [(True, 1)], [7.0]), record(1, [(True, 1), (True, 16), (False, 4)], [0.5, 2.0, 9.0])]
    records.append(record(2, [(True, 16), (False, 1)], [3.0, 8.0]))
    job = rows.KeptJob(RESULTS / "x.rounds.jsonl.gz", "ner", "j4", "0", "dssra", records, [])
    vanilla = [record(t, [(True, 1), (True, 1)], [0.0, 0.0], method="vanilla_fl") for t in (1, 2)]
    other = rows.KeptJob(RESULTS / "y.rounds.jsonl.gz", "ner", "j4", "0", "vanilla_fl", vanilla, [])
    by_m = load("clock_consistency").decoder_by_m([job, other])
    assert by_m == {("ner", "j4", 1): [0.5], ("ner", "j4", 16): [2.0, 3.0]}
    nameless = rows.KeptJob(RESULTS / "z.rounds.jsonl.gz", "ner", "j4", "0", "x", [{"round": 1}], [])
    with pytest.raises(ValueError, match="z.rounds.jsonl.gz: its rounds name no method"):
        load("clock_consistency").decoder_by_m([nameless])


def test_the_same_plan_in_two_jobs_is_compared_by_its_median_compute_by_hand():
    """Seed 0: plan A (cluster 0, S = 1, m = 1) reads 10, 12, 11 s in dssra and 10, 10, 10 in titanic (1.1); plan B
    (cluster 1, S = 2, m = 4) only twice in titanic: left out (fewer than 3). Their clocks were set against 100e9
    and 110e9 FLOP/s, so the CPU seconds' ratio is 1.1 x 110 / 100 = 1.21. Seed 1's lone job pairs with none, and
    a VanillaFL job whose plans have plan A's delta_k but data users on two devices (other work) with neither."""
    rows = load("virtual_paper_rows")

    def record(t, cells, host_flops):
        plans = [{"cluster": n, "selected": True, "S": S, "m": m, "delta": [6 // S] * S} for n, S, m, _ in cells]
        virtual = {"clusters": {str(n): {"compute_s": c} for n, _, _, c in cells}, "host_flops": host_flops}
        return {"round": t, "plan": {"clusters": plans}, "virtual": virtual}

    dssra = [record(t, [(0, 1, 1, c), (1, 2, 4, 5.0)], 100e9) for t, c in ((1, 10.0), (2, 12.0), (3, 11.0))]
    titanic = [record(t, [(0, 1, 1, 10.0)] + ([(1, 2, 4, 4.0)] if t < 3 else []), 110e9) for t in (1, 2, 3)]
    jobs = [
        rows.KeptJob(RESULTS / "x", "ner", "j4", "0", run, recs, [])
        for run, recs in (("dssra", dssra), ("titanic", titanic))
    ]
    jobs.append(rows.KeptJob(RESULTS / "x", "ner", "j4", "1", "dssra", dssra, []))
    # VanillaFL's plan with plan A's delta_k but two data users on devices 0 and 3 (each half the batch): not plan A
    vanilla = [{**r, "plan": {"clusters": [{**r["plan"]["clusters"][0], "user_devices": [0, 3]}]}} for r in dssra]
    jobs.append(rows.KeptJob(RESULTS / "x", "ner", "j4", "0", "vanilla_fl", vanilla, []))
    (got,) = load("clock_consistency").same_plan_ratios(jobs)
    assert (got["seed"], got["pair"]) == ("0", ("dssra", "titanic"))
    assert got["ratios"] == [pytest.approx(1.1)] and got["cpu_ratios"] == [pytest.approx(1.21)]


def test_the_probe_fit_recovers_how_cpu_seconds_follow_the_reading_by_hand():
    """Two jobs of one part, one plan each over six rounds, readings 50-150e9 FLOP/s. In the first the devices'
    CPU seconds are 1000e9 / reading exactly (a host twice as fast halves them): slope -1, and set against each
    round's reading they do not move (spread 0). In the second they do not follow the reading at all (the same
    seconds whatever it reads): slope 0, spread 0, and set against the reading they take its spread. A job
    without readings (a probe at start-up only) and a plan of four rounds are left out."""
    rows = load("virtual_paper_rows")
    readings = [50e9, 70e9, 90e9, 110e9, 130e9, 150e9]

    def record(t, reading, cpu_s, plan=(0, 1, 1)):
        cluster, S, m = plan
        virtual = {
            "host_reading": reading,
            "host_flops": 100e9,
            "clusters": {str(cluster): {"compute_s": cpu_s * 100e9}},
        }
        return {
            "round": t,
            "plan": {"clusters": [{"cluster": cluster, "S": S, "m": m, "selected": True}]},
            "virtual": virtual,
        }

    follows = [record(t + 1, r, 1000e9 / r) for t, r in enumerate(readings)]
    steady = [record(t + 1, r, 4.0) for t, r in enumerate(readings)]
    steady += [record(t + 7, r, 9.0, plan=(1, 2, 4)) for t, r in enumerate(readings[:4])]  # four rounds: left out
    unread = [{**r, "virtual": {**r["virtual"], "host_reading": None}} for r in follows]
    jobs = [
        rows.KeptJob(RESULTS / "x", "ner", "j4", "0", run, recs, [])
        for run, recs in (("dssra", follows), ("titanic", steady), ("random", unread))
    ]
    (got,) = load("clock_consistency").probe_fit(jobs[:1])
    assert (got["part"], got["cu_rounds"]) == ("ner", 6)
    assert got["slope"] == pytest.approx(-1.0) and got["sd_read"] == pytest.approx(0.0, abs=1e-12)
    (got,) = load("clock_consistency").probe_fit(jobs[1:])
    assert got["cu_rounds"] == 6 and got["slope"] == pytest.approx(0.0, abs=1e-12) and got["sd"] == pytest.approx(0.0)
    logs = [math.log(r) for r in readings]
    mean = sum(logs) / len(logs)
    assert got["sd_read"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs)))


def test_c10_reads_the_queue_each_selected_plan_was_made_with_by_hand():
    """Two trained rounds of N = 2 (round 0 and an unselected CU left out): CU-rounds (S, m, Gamma_n, Y_n) = (1, 1,
    2.0, 0.5), (4, 8, 6.0, 0.0), (1, 2, 2.0, 1.5) taking 20, 30 and 30 virtual s; mean Gamma 10/3, Y_n > 0 in 2 of 3,
    S = 1 in both of those and in none of the one with Y_n = 0, mean m 11/3, median CU-round 25 and 30 s."""
    c10 = load("virtual_paper_tables").c10_queue  # results/reportlib/c10_queue.py

    def trained(t, plans, figures):
        section = modelled_section(0.0, [{} for _ in plans])
        section["gamma_max"] = 3.5
        for cluster, (gamma, queue) in zip(section["clusters"], figures):
            cluster.update(gamma=gamma, Y=queue)
        clusters = [{"cluster": n, "selected": S > 0, "S": S, "m": m} for n, (S, m) in enumerate(plans)]
        virtual = {"clusters": {str(n): {"total_s": 10.0 * (t + n + 1)} for n, (S, _) in enumerate(plans) if S}}
        return {"round": t, "plan": {"clusters": clusters}, "modelled": section, "virtual": virtual}

    records = [
        trained(0, [(6, 16), (6, 16)], [(9.0, 9.0), (9.0, 9.0)]),  # set-up round: not a trained round
        trained(1, [(1, 1), (4, 8)], [(2.0, 0.5), (6.0, 0.0)]),
        trained(2, [(1, 2), (0, 0)], [(2.0, 1.5), (9.0, 9.0)]),  # CU 1 sits round 2 out
    ]
    got = c10.c10_queue(records)
    assert got == {
        "gamma_max": 3.5,
        "gamma_mean": 3.333,
        "cu_rounds": 3,
        "y_positive_share": 0.667,
        "s1_share_y_positive": 1.0,
        "s1_share_y_zero": 0.0,
        "mean_m": 3.67,
        "cu_round_y_positive_s": 25.0,  # CU 0's rounds 1 and 2: 20 and 30 s
        "cu_round_y_zero_s": 30.0,  # CU 1's round 1
    }
    assert c10.c10_queue([records[0]])["cu_rounds"] == 0  # no trained round: shares left blank
    assert c10.c10_queue([records[0]])["s1_share_y_positive"] == ""


def test_the_clocks_error_is_read_per_cu_round_against_the_measured_steps(tmp_path):
    tables = load("virtual_clock_tables")
    parts = {"compute_s": 3.0, "d2d_s": 1.0, "cu_s": 0.5, "uplink_s": 0.5, "decoder_s": 1.0, "setup_s": 9.0}
    parts["device_s"] = [2.0, 0.0, 1.5]
    record = {
        "round": 1,
        "virtual": {"clusters": {"0": parts}, "round_s": 15.0, "slowest": 0},
        "modelled": modelled_section(4.0, [{"delay_s": 4.0}]),
        "clients": {
            "0": {
                "steps": 5,
                "seconds-train": 7.0,
                "seconds-upload": 1.0,
                "seconds-uplink-wait": 0.25,
                "device-compute-seconds": [2.5, 0.0, 1.5],
            }
        },
    }
    rows = tables.cu_rounds([record])
    assert len(rows) == 1
    assert rows[0]["virtual_s"] == pytest.approx(6.0)  # set-up left out on both sides
    assert tables.errors(rows, "virtual_s") == [pytest.approx(-0.25)]  # (6 - 8) / 8
    assert tables.errors(rows, "eq26_s") == [pytest.approx(-0.5)]
    with gzip.open(tmp_path / "s0.rounds.jsonl.gz", "wt") as f:
        f.write(json.dumps(record) + "\n")
    assert tables.pair_errors(tables.device_rounds([record])) == [pytest.approx(-0.2), pytest.approx(0.0)]
    assert tables.pair_errors(tables.uplink_rounds([record])) == [pytest.approx(-0.6)]  # 0.5 against 1.25
    text = tables.table(tmp_path)
    assert "| dssra: virtual clock, a CU-round's steps and upload | 1 | 25.0% | 25.0% | -25.0% |" in text


def test_the_campaign_has_every_method_per_seed_and_channel_count_on_the_virtual_clock():
    campaign = load("virtual_paper")
    todo = campaign.paper_jobs([4, 2], [0, 1, 2], list(campaign.RUNS))
    assert len(todo) == 2 * 3 * 6 and len({j.name for j in todo}) == len(todo)
    job = next(j for j in todo if j.name == "j2/s1/vanilla_fl")
    for part in ("clock=virtual", "network=testbed_paper", "network.num_channels=2", "seed=1", "method=vanilla_fl"):
        assert part in job.overrides.split()
    assert not campaign.is_kept(job, records=RESULTS / "no such folder")
    scale = campaign.scale_jobs([10, 30], [0])
    assert {j.name for j in scale} == {f"n{n}/s0/{r}" for n in (10, 30) for r in ("dssra", "titanic", "random")}


def test_c10s_sensitivity_runs_only_when_asked_and_only_moves_gamma_max():
    """The two C10 runs are CollaPipe's job with Gamma^max alone changed (auto: 2.07 at N = 3, L = 6, J = 4; off: a
    bound no Gamma_n reaches), and the default queue (the six runs the claims read) leaves them out."""
    from collapipe_flwr.config import load_run_config

    campaign = load("virtual_paper")
    assert not set(campaign.C10_RUNS) & set(campaign.RUNS)
    jobs = campaign.task_jobs("classification", [4], [0], ["dssra", *campaign.C10_RUNS])
    base, auto, off = (load_run_config(j.overrides.split()) for j in jobs)
    assert auto.scheduler.gamma_max_auto and off.scheduler.gamma_max >= 1e6
    for cfg in (auto, off):  # everything else is CollaPipe's job
        same = dataclasses.replace(cfg, scheduler=base.scheduler)
        assert same == base


@pytest.mark.parametrize(
    ("part", "task", "eval_size"), [("classification", "classification", "CLS_EVAL"), ("ner", "ner", "NER_EVAL")]
)
def test_a_task_part_keeps_the_setting_and_swaps_only_the_task_model_and_evaluation(part, task, eval_size):
    """A task part (classification, NER): every translation job's setting, with the task, the model and the eval
    size replaced (a config that loads), and no job before its target is fixed, only the pilot."""
    from collapipe_flwr.config import load_run_config

    campaign = load("virtual_paper")
    translation = campaign.paper_jobs([4, 2], [0], ["dssra", "random"])
    jobs = campaign.task_jobs(part, [4, 2], [0], ["dssra", "random"])
    assert [j.name for j in jobs] == [j.name for j in translation]
    for ours, theirs in zip(jobs, translation, strict=True):
        kept = set(theirs.overrides.split()) - {
            "model=transformer_small",
            "model.enc_layers=6",
            "eval.max_examples=256",
        }
        assert kept <= set(ours.overrides.split())
    cfg = load_run_config(jobs[0].overrides.split())
    assert (cfg.task.name, cfg.model.name, cfg.model.sizes["layers"]) == (task, "bert_small", 6)
    assert cfg.clock.mode == "virtual" and cfg.eval.max_examples == getattr(campaign, eval_size)
    assert campaign.pilot_job(part).part == "pilot"  # never under records/
    if campaign.TASK_PARTS[part].target is None:
        with pytest.raises(SystemExit):
            campaign.main(["/nonexistent-root", "--part", part])


def test_a_task_part_is_timed_on_its_own_metric_and_only_once_its_target_is_fixed(monkeypatch):
    tables = load("virtual_paper_rows")
    records = [{"round": 1, "virtual": {"round_s": 4.0}, "val_accuracy": 0.5, "val_bleu": 30.0}]
    records.append({"round": 2, "virtual": {"round_s": 5.0}, "val_accuracy": 0.7})
    assert tables.time_to_target(records, 0.6, "val_accuracy") == (9.0, 2, 0.7)
    assert tables.quality_target("paper") == ("val_bleu", tables.virtual_paper.TARGET_BLEU)
    task = tables.virtual_paper.TASK_PARTS["classification"]
    monkeypatch.setitem(
        tables.virtual_paper.TASK_PARTS, "classification", type(task)(task.model, task.eval, task.metric, None)
    )
    with pytest.raises(ValueError, match="not fixed"):
        tables.quality_target("classification")


def test_the_committed_tables_are_regenerated_from_the_kept_records():
    clock = load("virtual_clock_tables")
    assert clock.table() == (RESULTS / "virtual_clock" / "table.md").read_text(encoding="utf-8")
    paper = load("virtual_paper_tables")
    committed = (RESULTS / "virtual_paper" / "table.md").read_text(encoding="utf-8")
    text, csv_text = paper.outputs()
    assert text == committed
    with (RESULTS / "virtual_paper" / "runs.csv").open(encoding="utf-8", newline="") as f:
        runs = f.read()
    assert csv_text == runs, "run python results/virtual_paper_tables.py"


def test_the_kept_jobs_are_read_with_their_overrides_leaving_superseded_and_kept_apart_ones_out(tmp_path):
    """A compared job, a superseded one at the same depth and one kept apart below ``other_host/``: the compared
    read sees the first only; reading ``other_host/`` itself sees the kept-apart one."""
    rows = load("virtual_paper_rows")

    def keep(folder, run, overrides):
        folder.mkdir(parents=True)
        with gzip.open(folder / f"{run}.rounds.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(json.dumps({"round": 1, "virtual": {"round_s": 2.0}}) + "\n")
        (folder / f"{run}.status.json").write_text(json.dumps({"overrides": overrides}), encoding="utf-8")

    keep(tmp_path / "paper" / "j4" / "s0", "dssra", ["seed=0"])
    keep(tmp_path / "superseded" / "paper" / "j4", "dssra", ["seed=9"])
    keep(tmp_path / "other_host" / "paper" / "j2" / "s3", "titanic", ["seed=3"])
    (job,) = rows.read_jobs(tmp_path)
    assert (job.part, job.setting, job.seed, job.run, job.overrides) == ("paper", "j4", "0", "dssra", ["seed=0"])
    assert job.records == [{"round": 1, "virtual": {"round_s": 2.0}}]
    (apart,) = rows.read_jobs(tmp_path / "other_host")
    assert (apart.setting, apart.seed, apart.run) == ("j2", "3", "titanic")


def test_a_job_set_against_another_speed_than_its_seeds_is_marked_by_written_speeds_only():
    """Seed 0's clock-written speeds 26.2, 21.1 and 25.9 GFLOP/s: median 25.9, and 21.1 is 18.5% below it, the only
    one more than 10% off. Seed 1's 20 and 21.5 are within 10% of their median (20.75); its old record read back
    at 80 from its devices (wall seconds) is not judged and does not move the median."""
    tables = load("virtual_paper_rows")

    def row(seed, run, speed, read="clock"):
        return {
            "part": "classification",
            "setting": "j4",
            "seed": seed,
            "run": run,
            "host_gflops": speed,
            "host_read": read,
        }

    rows = [row("0", "dssra", 26.2), row("0", "random", 21.1), row("0", "no_ss", 25.9), row("0", "vanilla_fl", "", "")]
    rows += [row("1", "dssra", 20.0), row("1", "titanic", 21.5), row("1", "random", 80.0, "devices")]
    marked = tables.mark_host_off(rows)
    assert [r["host_off"] for r in marked] == ["no", "yes", "no", "", "no", "no", ""]


def test_a_jobs_code_version_is_its_checkouts_commit_marked_when_its_tracked_files_changed(tmp_path):
    import subprocess

    campaign = load("campaign")
    assert campaign.code_version(tmp_path) == ""  # not a git checkout

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "clock.py").write_text("SCALE = 1\n")
    git("add", "clock.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clock")
    head = git("rev-parse", "HEAD")
    (tmp_path / "records.csv").write_text("kept\n")  # an untracked file (a kept record) is not a change of code
    assert campaign.code_version(tmp_path) == head
    (tmp_path / "clock.py").write_text("SCALE = 2\n")
    assert campaign.code_version(tmp_path) == f"{head}+changes"


def test_the_host_scale_spread_pools_each_pairs_median_log_ratio_by_hand():
    """NER seed 0: dssra and titanic share plan A (three CU-rounds each). dssra reads 11 s of virtual compute at a
    host speed of 100e9, titanic 10 s at 110e9: the probe's log ratio ln(1.1), the CPU seconds' ln(1.1 x 110 / 100)
    = ln(1.21). Classification seed 0: the same plan read 10 s at 100e9 and 10 s at 50e9: ln 1 and ln 0.5. Per part
    one pair, so its RMS is the |log|; over both, sqrt((a^2 + b^2) / 2). A VanillaFL job (its devices train the whole
    model) and a job without per-round readings are left out, so they add no pair."""
    rows = load("virtual_paper_rows")

    def job(part, run, compute_s, host_flops, method="collapipe", reading=True):
        plan = [{"cluster": 0, "selected": True, "S": 1, "m": 1, "delta": [6]}]
        virtual = {"clusters": {"0": {"compute_s": compute_s}}, "host_flops": host_flops}
        if reading:
            virtual["host_reading"] = host_flops
        recs = [{"round": t, "method": method, "plan": {"clusters": plan}, "virtual": virtual} for t in (1, 2, 3)]
        return rows.KeptJob(RESULTS / "x", part, "j4", "0", run, recs, [])

    jobs = [
        job("ner", "dssra", 11.0, 100e9),
        job("ner", "titanic", 10.0, 110e9),
        job("ner", "vanilla_fl", 30.0, 100e9, method="vanilla_fl"),
        job("ner", "random", 20.0, 100e9, reading=False),
        job("classification", "dssra", 10.0, 100e9),
        job("classification", "random", 10.0, 50e9),
    ]
    got = {r["part"]: r for r in load("clock_consistency").host_scale_spread(jobs)}
    assert [r["part"] for r in load("clock_consistency").host_scale_spread(jobs)] == ["classification", "ner", "both"]
    assert got["ner"]["pairs"] == 1 and got["both"]["pairs"] == 2
    assert got["ner"]["rms_probe"] == pytest.approx(math.log(1.1))
    assert got["ner"]["rms_constant"] == pytest.approx(math.log(1.21))
    assert got["classification"]["rms_probe"] == pytest.approx(0.0, abs=1e-12)
    assert got["classification"]["rms_constant"] == pytest.approx(math.log(2.0))
    both = math.sqrt((math.log(1.1) ** 2 + 0.0) / 2), math.sqrt((math.log(1.21) ** 2 + math.log(2.0) ** 2) / 2)
    assert (got["both"]["rms_probe"], got["both"]["rms_constant"]) == (pytest.approx(both[0]), pytest.approx(both[1]))
    assert got["both"]["smaller"] == "probe"
