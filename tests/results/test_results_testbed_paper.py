"""results/testbed_paper_tables.py: the committed tables are what the kept records give, and the measured round
reads the clusters (and VanillaFL's data users) as parallel, checked on a record built by hand."""

from __future__ import annotations

import gzip

import pytest

from tests.paths import ROOT
from tests.results_scripts import load, modelled_section

RESULTS = ROOT / "results"


def _module():
    return load("testbed_paper_tables")


def _cu(total: float, train: float, upload: float, users=None, compute=(1.0, 2.0), peaks=(100.0, 300.0)) -> dict:
    cu = {
        "seconds-total": total,
        "seconds-train": train,
        "seconds-upload": upload,
        "seconds-step-head": 0.5,
        "device-compute-seconds": list(compute),
        "device-measured-peak-bytes": list(peaks),
    }
    if users is not None:
        cu["seconds-users"] = list(users)
    return cu


def _round(t: int, loss: float, round_s: float, clients: dict, modelled_round: float = 4.0) -> dict:
    return {
        "round": t,
        "train_loss": loss,
        "measured_s": {"round_s": round_s},
        "clients": clients,
        "plan": {"clusters": [{"cluster": int(n), "selected": True, "S": 2} for n in clients]},
        "modelled": modelled_section(
            modelled_round, [{"delay_s": 3.0, "compute_s": 1.5, "overhead_s": 0.2}] * len(clients)
        ),
        "memory": {"clusters": {n: {"modelled_bytes": [50.0, 200.0]} for n in clients}},
    }


def test_measured_round_reads_clusters_and_data_users_as_parallel():
    tables = _module()
    # two clusters one after another on the server's clock (10 + 6 of its 20 s); cluster 0's three data users ran
    # one after another: 2 + 3 + 4 s of steps in its 9.5 s of training, the other 0.5 s their hand-overs. In
    # parallel: the slowest user's 4 s + one user's share of the hand-overs (0.5 / 3), and the CU's 0.5 s outside
    # training (10 - 9.5)
    r = _round(1, 7.5, 20.0, {"0": _cu(10.0, 9.5, 0.5, users=(2.0, 3.0, 4.0)), "1": _cu(6.0, 5.0, 1.0)})
    assert tables.cu_total(r["clients"]["0"]) == pytest.approx(0.5 + 4.0 + 0.5 / 3)
    assert tables.cu_total(r["clients"]["1"]) == pytest.approx(6.0)
    # the server's 4 s outside the CUs + the slowest cluster's 6 s
    assert tables.measured_round(r) == pytest.approx(20.0 - 16.0 + 6.0)
    # eq. (26)'s CU-side terms: local steps (users in parallel) + upload
    assert tables.cu_round_s(r["clients"]["0"]) == pytest.approx(4.0 + 0.5 / 3 + 0.5)


def test_data_users_with_measured_hand_overs_are_read_from_their_own_hand_overs():
    tables = _module()
    # three users: steps 2, 3, 4 s and hand-overs 0.1, 1.5, 0.2 s in 12 s of training; the other
    # 12 - 10.8 = 1.2 s (the average, the batches) is the CU's own. In parallel: the slowest user by steps and
    # hand-over together (3 + 1.5 = 4.5 s, not the 4 s of the slowest steps) + the CU's 1.2 s
    cu = _cu(13.0, 12.0, 0.5, users=(2.0, 3.0, 4.0))
    cu["seconds-users-handover"] = [0.1, 1.5, 0.2]
    assert tables.parallel_train_s(cu) == pytest.approx(4.5 + 1.2)
    assert tables.cu_total(cu) == pytest.approx(1.0 + 4.5 + 1.2)
    measured = _round(1, 7.5, 20.0, {"0": cu})
    estimated = _round(2, 7.5, 20.0, {"0": _cu(10.0, 9.5, 0.5, users=(2.0, 3.0, 4.0))})
    assert tables.users_read(measured) == "measured" and tables.users_read(estimated) == "estimated"
    assert tables.users_read(_round(3, 7.5, 20.0, {"0": _cu(10.0, 9.5, 0.5)})) == ""
    assert tables.job_row(4, 0, "vanilla_fl", [measured])["users_read"] == "measured"
    assert tables.job_row(4, 0, "vanilla_fl", [measured, estimated])["users_read"] == "estimated"


def test_time_to_target_counts_rounds_up_to_the_first_that_reaches_it_and_can_miss():
    tables = _module()
    target = tables.TARGET_LOSS
    rounds = [
        _round(1, target + 2, 30.0, {"0": _cu(10.0, 8.0, 1.0)}),
        _round(2, target - 0.1, 12.0, {"0": _cu(10.0, 8.0, 1.0)}),
        _round(3, target - 0.5, 12.0, {"0": _cu(10.0, 8.0, 1.0)}),
    ]
    rounds[1]["clients"]["0"]["lost-for-memory"] = [1, 4]  # two devices the kernel killed in round 2
    row = tables.job_row(4, 0, "dssra", rounds)
    assert row["lost_for_memory"] == 2
    assert row["target_round"] == 2
    assert row["measured_s_to_target"] == pytest.approx(30.0 + 12.0)
    assert row["measured_s_total"] == pytest.approx(54.0)
    assert row["peak_device_mb"] == pytest.approx(300.0 / 2**20)
    assert row["modelled_peak_device_mb"] == pytest.approx(200.0 / 2**20)
    missed = tables.job_row(4, 0, "vanilla_fl", [_round(1, target + 1, 30.0, {"0": _cu(10.0, 8.0, 1.0)})])
    assert missed["target_round"] == "" and missed["measured_s_to_target"] == ""


def test_committed_tables_are_what_the_kept_records_give(tmp_path):
    tables = _module()
    kept = tables.HERE / "records"
    assert any(kept.glob("j*/s*/*.rounds.jsonl.gz")), f"no kept records under {kept}"
    (tmp_path / "records").symlink_to(kept)
    text, rows = tables.write(tmp_path)
    assert (tables.HERE / "table.md").read_text() == text, "regenerate: python results/testbed_paper_tables.py"
    assert (tables.HERE / "runs.csv").read_text() == rows, "regenerate: python results/testbed_paper_tables.py"


def _campaign():
    return load("testbed_paper")


def test_the_campaign_runs_every_method_per_seed_and_channel_count_and_keeps_its_records(tmp_path):
    campaign = _campaign()
    todo = campaign.jobs([4, 2], [0, 1], list(campaign.RUNS), rounds=6, steps=5)
    assert len(todo) == 2 * 2 * 6 and len({j.name for j in todo}) == len(todo)
    job = next(j for j in todo if j.name == "j2/s1/vanilla_fl")
    for part in ("network=testbed_paper", "network.num_channels=2", "seed=1", "network.seed=1", "method=vanilla_fl"):
        assert part in job.overrides.split()
    run = tmp_path / "root" / job.name
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text('{"round": 1}\n')
    (run / "summary.json").write_text("{}")
    (run / "status.json").write_text('{"ok": true}')
    dest = campaign.keep(tmp_path / "root", job, records=tmp_path / "records")
    assert dest == tmp_path / "records" / "j2" / "s1"
    with gzip.open(dest / "vanilla_fl.rounds.jsonl.gz", "rt") as f:
        assert f.read() == '{"round": 1}\n'
    assert (dest / "vanilla_fl.status.json").read_text() == '{"ok": true}'


def test_d2d_link_seconds_are_the_slowest_clusters_summed_over_its_devices_or_absent():
    tables = _module()
    # rounds 2 and 3 are steady; cluster 0 is the slowest in both (10 s against 6 s); its devices' links held
    # 0.25 + 0.5 s, then 1.0 + 0.25 s: a mean of 1.0 s. Records from before the metric give "" (shown as "-")
    rounds = []
    for t, links in ((1, (9.0, 9.0)), (2, (0.25, 0.5)), (3, (1.0, 0.25))):
        slow, fast = _cu(10.0, 9.5, 0.5), _cu(6.0, 5.0, 1.0)
        slow["device-link-seconds"], fast["device-link-seconds"] = list(links), [5.0, 5.0]
        rounds.append(_round(t, 7.5, 20.0, {"0": slow, "1": fast}))
    assert tables.job_row(4, 0, "dssra", rounds)["steady_d2d_link_s"] == pytest.approx(1.0)
    old = [_round(t, 7.5, 20.0, {"0": _cu(10.0, 9.5, 0.5)}) for t in (1, 2)]
    assert tables.job_row(4, 0, "dssra", old)["steady_d2d_link_s"] == ""
