"""Old virtual-clock records read at the configured server and CU speeds (results/reportlib/host_speed.py): the
round recomputed by hand, the host's speed read back from devices built from the job's own network draw, and a
read-back refused where the devices disagree."""

from __future__ import annotations

import pytest

from tests.results_scripts import load

load("virtual_paper_tables")  # puts results/ on sys.path, where reportlib lives
from reportlib import host_speed  # noqa: E402

OVERRIDES = ["network=testbed_paper", "network.seed=1", "network.num_channels=2", "federation.num_clusters=3"]


def _cluster(compute, cu, setup, decoder, uplink=1.0, device_s=(0.0,)):
    return {
        "compute_s": compute,
        "d2d_s": 0.0,
        "cu_s": cu,
        "uplink_s": uplink,
        "setup_s": setup,
        "decoder_s": decoder,
        "device_s": list(device_s),
        "total_s": compute + cu + uplink + setup + decoder,
    }


def test_a_record_is_read_with_its_own_work_at_the_configured_speeds_by_hand():
    # host 2e10, server and CUs 8e10: their own work takes a quarter of the host's seconds
    record = {
        "round": 3,
        "virtual": {
            "clusters": {"0": _cluster(10.0, 0.4, 2.0, 8.0), "1": _cluster(12.0, 0.4, 0.0, 0.4)},
            "server_s": 1.0,
            "slowest": 0,
            "round_s": 22.4,
        },
    }
    got = host_speed.at_reference(record, 2e10, server_flops=8e10, cu_flops=8e10)["virtual"]
    # cluster 0: 10 + 0.1 + 1 + 0.5 + 2 = 13.6; cluster 1: 12 + 0.1 + 1 + 0 + 0.1 = 13.2
    assert got["clusters"]["0"]["total_s"] == pytest.approx(13.6)
    assert got["clusters"]["1"]["total_s"] == pytest.approx(13.2)
    assert got["clusters"]["0"]["decoder_s"] == pytest.approx(2.0)
    assert got["round_s"] == pytest.approx(13.6 + 0.25)
    assert (got["slowest"], got["server_scale"], got["host_flops"]) == (0, 0.25, 2e10)
    assert record["virtual"]["round_s"] == 22.4  # the kept record is not changed
    # cluster 0's set-up no longer decides once it is read faster than cluster 1's compute
    record["virtual"]["clusters"]["0"]["setup_s"] = 0.0
    record["virtual"]["clusters"]["0"]["total_s"] = 19.4
    assert host_speed.at_reference(record, 2e10, 8e10, 8e10)["virtual"]["slowest"] == 1


def test_a_record_written_at_the_configured_speeds_is_left_as_it_is():
    record = {"round": 1, "virtual": {"clusters": {"0": _cluster(1.0, 1.0, 1.0, 1.0)}, "server_scale": 0.5}}
    assert host_speed.at_reference(record, 2e10, 8e10, 8e10) == record


def _records_on(host_flops, cpu=2.0, rounds=3):
    """Rounds whose every device ran ``cpu`` compute seconds, charged as the clock charges them on that host."""
    devices = host_speed.job_network(OVERRIDES).devices
    out = []
    for t in range(1, rounds + 1):
        clients, clusters = {}, {}
        for n in range(3):
            clients[str(n)] = {"device-compute-seconds": [cpu] * 6}
            device_s = [cpu * host_flops / d.flops_per_second for d in devices[n]]
            clusters[str(n)] = _cluster(5.0, 0.1, 0.1, 2.0, device_s=device_s)
        out.append({"round": t, "clients": clients, "virtual": {"clusters": clusters, "server_s": 0.1, "slowest": 0}})
    return out


def test_the_hosts_speed_is_read_back_from_the_jobs_own_devices():
    read, host = host_speed.records_at_reference(_records_on(2e10), OVERRIDES, "hand-built")
    assert host == pytest.approx(2e10)
    assert read[0]["virtual"]["clusters"]["0"]["decoder_s"] == pytest.approx(2.0 * 2e10 / 8e10)


def test_a_read_back_is_refused_where_the_devices_disagree():
    records = _records_on(2e10)
    for record in records[1:]:  # two of three rounds' compute seconds inflated, as a shared machine's wall seconds are
        for client in record["clients"].values():
            client["device-compute-seconds"] = [4.0] * 6
    with pytest.raises(ValueError, match="devices disagree"):
        host_speed.records_at_reference(records, OVERRIDES, "hand-built")
    other_draw = [*OVERRIDES[:1], "network.seed=2", *OVERRIDES[2:]]  # another seed's devices: the ratios scatter
    with pytest.raises(ValueError, match="devices disagree"):
        host_speed.records_at_reference(_records_on(2e10), other_draw, "hand-built")


def _keep(folder, run, records):
    import gzip
    import json

    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{run}.rounds.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    (folder / f"{run}.status.json").write_text(json.dumps({"overrides": OVERRIDES}))


def test_the_host_check_reads_the_kept_jobs_that_ran_alone_and_refuses_a_host_off_their_speed(tmp_path, monkeypatch):
    check = load("host_check")
    _keep(tmp_path / "paper" / "j2" / "s1", "dssra", _records_on(8e10))
    shared = _records_on(8e10)
    for client in shared[1]["clients"].values():
        client["device-compute-seconds"] = [6.0] * 6
    _keep(tmp_path / "paper" / "j2" / "s1", "random", shared)  # its devices disagree: left out
    assert check.kept_host_flops("paper", tmp_path) == [pytest.approx(8e10)]
    monkeypatch.setattr(check, "kept_host_flops", lambda part: [7.5e10, 8e10, 8.5e10])
    monkeypatch.setattr(check, "this_host_flops", lambda overrides: 2e10)  # 4x slower than the kept jobs' host
    assert check.main([]) == 1
    monkeypatch.setattr(check, "this_host_flops", lambda overrides: 7.2e10)  # 10% slower: within the tolerance
    assert check.main([]) == 0


def _written_on(host_flops, rounds=3):
    """Rounds as the current clock writes them: its host speed in ``virtual.host_flops`` beside ``server_scale``."""
    out = _records_on(host_flops, rounds=rounds)
    for record in out:
        record["virtual"].update(host_flops=host_flops, server_scale=host_flops / 8e10)
    return out


def test_a_jobs_host_speed_is_the_clocks_where_it_wrote_one_and_never_vanilla_fls_read_back():
    records = _written_on(2.6e10)
    records[1]["virtual"]["host_flops"] = 9e10  # one odd reading: the median of the three rounds
    assert host_speed.job_host_flops(records, ["method=vanilla_fl"], "hand-built") == 2.6e10
    assert host_speed.job_host_flops(_records_on(2e10), OVERRIDES, "hand-built") == pytest.approx(2e10)
    with pytest.raises(ValueError, match="VanillaFL"):
        host_speed.job_host_flops(_records_on(2e10), [*OVERRIDES, "method=vanilla_fl"], "hand-built")


def test_a_speed_is_off_another_beyond_a_tenth_of_it():
    assert not host_speed.off_speed(2.7e10, 2.5e10)  # 8%
    assert host_speed.off_speed(2.11e10, 2.59e10)  # 18.5% below
    assert host_speed.off_speed(2.9e10, 2.6e10)  # 11.5% above


def test_two_hosts_are_speeds_more_than_a_fifth_apart():
    assert not host_speed.two_hosts([2.6e10])
    assert not host_speed.two_hosts([2.0e10, 2.38e10, 2.2e10])  # 19%: one host
    assert host_speed.two_hosts([2.0e10, 2.41e10])
    assert host_speed.two_hosts([8e10, 2e10])


def _keep_task(records_dir, seed, runs, host_flops):
    import json

    folder = records_dir / "classification" / "j4" / seed
    for run in runs:
        _keep(folder, run, _written_on(host_flops))
        (folder / f"{run}.summary.json").write_text(json.dumps({}))


def test_the_host_check_refuses_to_finish_a_seed_begun_on_another_host(tmp_path, capsys):
    check = load("host_check")
    _keep_task(tmp_path, "s0", ["dssra", "titanic"], 2.6e10)  # begun on a slow host
    _keep_task(tmp_path, "s1", list(check.virtual_paper.RUNS), 8e10)  # finished on a fast one: not asked about
    assert check.begun_seeds("classification", tmp_path) == {("j4", "s0"): [2.6e10, 2.6e10]}
    assert check.check_task_part("classification", 2.8e10, tmp_path) == 0  # 8% faster: the seed's speed
    assert check.check_task_part("classification", 8e10, tmp_path) == 1
    assert check.check_task_part("classification", 2.9e10, tmp_path) == 1  # 11.5% faster: off by more than a tenth
    assert "begun on another host" in capsys.readouterr().out


def test_the_host_check_says_a_part_with_no_seed_begun_may_start_here(tmp_path, capsys):
    check = load("host_check")
    _keep_task(tmp_path, "s1", list(check.virtual_paper.RUNS), 8e10)  # a finished seed only
    assert check.check_task_part("classification", 2.6e10, tmp_path) == 0
    assert "no seed begun and unfinished" in capsys.readouterr().out


def _rounds_with_decoder(decoder_terms):
    """A job's rounds whose slowest cluster's decoder term is each of ``decoder_terms`` in turn."""
    return [
        {"round": t, "virtual": {"clusters": {"0": _cluster(10.0, 0.1, 0.0, d)}, "server_s": 0.1, "slowest": 0}}
        for t, d in enumerate(decoder_terms, start=1)
    ]


def test_the_host_check_refuses_jobs_whose_decoder_term_is_another_hosts(tmp_path, capsys):
    import gzip
    import json

    check = load("host_check")
    records = tmp_path / "records"
    for seed, titanic, dssra in (("s0", 2.0, 2.4), ("s1", 2.2, 2.6), ("s2", 2.1, 3.4)):  # kept: medians 2.1 and 2.6
        folder = records / "paper" / "j4" / seed
        folder.mkdir(parents=True)
        for run, term in (("titanic", titanic), ("dssra", dssra)):
            lines = "".join(json.dumps(r) + "\n" for r in _rounds_with_decoder([term - 0.1, term, term + 0.5]))
            (folder / f"{run}.rounds.jsonl.gz").write_bytes(gzip.compress(lines.encode()))

    def job(run, terms):
        folder = tmp_path / "root" / "paper" / "j2" / "s3" / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rounds_with_decoder(terms)))
        return folder

    # 1.65x and 1.5x the kept medians (the medians of each job's rounds: 3.465 and 3.9): another kind of host
    slow = [job("titanic", [3.0, 3.465, 4.0]), job("dssra", [3.8, 3.9, 4.0])]
    assert check.check_jobs("paper", slow, records) == 1
    assert "another kind of host" in capsys.readouterr().err
    # 1.1x and 0.9x: the part's own spread
    same = [job("titanic", [2.31, 2.31, 2.31]), job("dssra", [2.34, 2.34, 2.34])]
    assert check.check_jobs("paper", same, records) == 0
    assert check.check_jobs("paper", [job("vanilla_fl", [0.0])], records) == 2  # nothing to compare with
