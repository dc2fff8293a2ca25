"""Domain skew: each extra corpus's held-out validation (tasks/domain_validation.py), and a run that reports the
global model on the global validation and on each domain's."""

from __future__ import annotations

import json

import pytest

from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.tasks.domain_validation import hold_out
from tests.inprocess_grid import InProcessGrid


def test_each_extra_corpus_holds_out_min_1000_or_a_tenth_of_itself_and_the_main_corpus_nothing():
    corpora = [50, 30, 20_000]  # sizes in file order; corpus 0 has its own validation file
    examples = [(c, i) for c, n in enumerate(corpora) for i in range(n)]
    train, sizes, held = hold_out(examples, corpora)
    assert sizes == [50, 27, 19_000] and sorted(held) == ["val_domain1", "val_domain2"]
    assert (len(held["val_domain1"]), len(held["val_domain2"])) == (3, 1000)  # 10% of 30; 1,000 < 10% of 20,000
    assert train[:50] == examples[:50]
    for d in (1, 2):
        mine = {x for x in examples if x[0] == d}
        kept = {x for x in train if x[0] == d}
        assert not kept & set(held[f"val_domain{d}"]) and kept | set(held[f"val_domain{d}"]) == mine
    assert hold_out(examples, corpora) == (train, sizes, held)  # the same examples on every call


@pytest.mark.e2e
@pytest.mark.slow
def test_a_domain_run_reports_the_global_and_each_domains_validation(data_dir, tmp_path):
    overrides = (
        "task=classification model=bert_tiny federation=tiny network=small federation.num_rounds=1 "
        "federation.local_steps=1 runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=32 "
        "task.partition=domain task.extra_train_files=[toutiao/supplementary_tnews_fewclue/tnews_fewclue_labeled.txt] "
        "run_name=domains"
    )
    run_config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    last = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()][-1]
    assert 0.0 <= last["val_accuracy"] <= 1.0 and 0.0 <= last["val_accuracy_domain1"] <= 1.0
    assert "val_loss_domain1" in last and last["val_loss_domain1"] != last["val_loss"]
