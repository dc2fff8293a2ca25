"""CollaPipeStrategy: the edge server's side of Algorithm 1 as a Flower strategy.

Per round t:
1. the round's channel/device state is sampled and the scheduling policy (DSSRA or a baseline) turns it
   into a plan X(t): which CUs get a channel, p_n, and S, m, delta_k per cluster;
2. each selected CU gets a ``train`` message with the global embedding + encoder and its plan; during
   the round it talks to the server's decoder over the data plane (never one Flower message per step);
3. the returned encoders theta_n^enc (⊕ of segments, eq. 4) are example-weighted averaged (FedAvg), each
   reply checked and folded into a running sum as it arrives (``reply_stream.py``, ``fl/weighted_mean.py``);
   the decoder is never averaged: it is trained on the server from every CU's activations;
4. the queues Y_n are updated (eq. 29), the global model is evaluated on the validation split, and one
   JSON line is logged.

Methods differ only in the plan and the aggregation (see ``MethodSpec``): ``pipeline`` keeps one encoder
per cluster (no aggregation) and reports the mean of the clusters' scores; ``vanilla_fl`` averages the
whole model (the head included) and needs no data plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from collapipe_flwr.errors import CannotContinue, CollaPipeError, ConfigError
from collapipe_flwr.fl.messages import (
    DEVICE_ACTORS_RELEASED,
    HELLO,
    HELLO_REPLY,
    LABEL_HISTOGRAM,
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
    RELEASE,
    RELEASE_REPLY,
    TRAIN,
    ReleaseInstructions,
    hello_content,
    metric_counts,
    metric_int,
    read_profile,
    read_reply,
    release_content,
    train_content,
    unpack_weights,
)
from collapipe_flwr.fl.records.progress import RoundProgress
from collapipe_flwr.fl.records.round_ledger import RoundLedger
from collapipe_flwr.fl.records.run_log import RunLog, read_rounds
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.fl.server.aggregation.global_model import RoundFold
from collapipe_flwr.fl.server.aggregation.reply_checks import check_reply
from collapipe_flwr.fl.server.checkpoint import save_checkpoint
from collapipe_flwr.fl.server.privacy_ledger import PrivacyLedger
from collapipe_flwr.fl.server.reply_stream import StreamingGrid
from collapipe_flwr.fl.server.round_exports import RoundAdapterExport
from collapipe_flwr.fl.server.server_state import ServerState
from collapipe_flwr.fl.server.training_watch import TrainingWatch
from collapipe_flwr.fl.server.virtual_round import virtual_round
from collapipe_flwr.heap_trim import trim_heap


class CollaPipeStrategy(Strategy):
    """Owns the global embedding + encoder, the server-side head, the plan and the aggregation.

    ``server`` is the run's :class:`~collapipe_flwr.fl.server.server_state.ServerState` (global model, round planner,
    decoder service, evaluator). The hooks configure, aggregate and evaluate only; the round's record, from
    ``configure_train`` to ``evaluate``, and its side effects (rounds.jsonl, the checkpoint, the progress display,
    the round listeners, the training watch's check) are kept by a
    :class:`~collapipe_flwr.fl.records.round_ledger.RoundLedger`.
    """

    def __init__(
        self,
        server: ServerState,
        run_log: RunLog,
        progress: RoundProgress | None = None,
        round_offset: int = 0,
        round_listeners: Sequence[Callable[[dict], None]] = (),
    ) -> None:
        self.server = server
        self.cfg = server.cfg
        self.run_log = run_log
        self.node_of_cluster: dict[int, int] = {}
        self.examples_of_cluster: dict[int, int] = {}
        self.labels_of_cluster: dict[int, list[int]] = {}  # D_n's examples per label (hello reply)
        self.round_offset = round_offset  # rounds completed before this process (a resumed run)
        self.watch = TrainingWatch(self.cfg.federation.max_failed_rounds)  # a run that trains nothing fails
        # the (epsilon, delta) spent with privacy on; a resumed run's counts come back from its kept records
        kept = read_rounds(run_log.folder) if round_offset else []
        self.privacy = PrivacyLedger.resumed(self.cfg.privacy, kept)
        # the virtual clock's server part of the round in flight (its plan's CPU seconds) and the decoder's CPU
        # per cluster when it began (fl/server/virtual_round.py)
        self._server_cpu_s = 0.0
        self._decoder_cpu0: dict[int, float] = {}
        self._host_reading: float | None = None  # this round's reading of the host's speed (clock.probe_every_round)
        # round_adapters: the adapters in PEFT's format after the rounds it names (None: not a LoRA causal LM)
        self.round_adapters = RoundAdapterExport.of(self.cfg, run_log.folder, round_offset)
        self.ledger = RoundLedger(
            run_log,
            progress,
            round_listeners,  # each gets every rounds.jsonl record (e.g. TensorBoard)
            self._save_checkpoint if self.cfg.checkpoint or self.round_adapters is not None else None,
            self.watch.check_streak,  # K rounds in a row whose CUs all failed: the run stops (its records kept)
        )

    def _save_checkpoint(self, t: int) -> None:
        """Round t's adapters (round_adapters), then its checkpoint: a run killed in between trains round t again."""
        if self.round_adapters is not None:
            self.round_adapters.after_round(t, self.server)
        if self.cfg.checkpoint:
            save_checkpoint(self.run_log.folder, self.server, t)

    def _open_round(self, t: int, started_at: float | None = None) -> None:
        self.ledger.open(t, self.cfg.method.name, self.server.planner.policy_name, started_at)

    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Result:
        """Flower's round loop (``Strategy.start``) over a :class:`StreamingGrid`, so that the train replies reach
        :meth:`aggregate_train` one at a time as they arrive."""
        return super().start(StreamingGrid(grid), *args, **kwargs)

    # ------------------------------------------------------------------ discovery
    def discover_clusters(self, grid: Grid, timeout_s: float = 120.0) -> None:
        """Ask every SuperNode which cluster (partition-id) it is; wait until all N CUs answered."""
        n_expected = self.cfg.federation.num_clusters
        deadline = time.time() + timeout_s
        node_ids: list[int] = []
        while time.time() < deadline:
            node_ids = list(grid.get_node_ids())
            if len(node_ids) >= n_expected:
                break
            time.sleep(1.0)
        if len(node_ids) < n_expected:
            raise ConfigError(
                f"federation.num_clusters={n_expected} but only {len(node_ids)} SuperNodes connected within "
                f"{timeout_s:.0f}s; start more SuperNodes, or in simulation use `collapipe run` (it sets "
                "num-supernodes to num-clusters) or set num-supernodes in $FLWR_HOME/config.toml"
            )
        content = hello_content(self.cfg.cluster_config().to_dict())
        msgs = [Message(content, dst_node_id=n, message_type=HELLO) for n in node_ids]
        replies = list(grid.send_and_receive(msgs, timeout=timeout_s))
        for reply in replies:
            if reply.has_error():
                raise CollaPipeError(
                    f"SuperNode {reply.metadata.src_node_id} failed to say hello: {reply.error.reason}"
                )
            info, sender = reply.content.metric_records[HELLO_REPLY], reply.metadata.src_node_id
            pid, nparts = metric_int(info, PARTITION_ID, sender), metric_int(info, NUM_PARTITIONS, sender)
            if nparts != n_expected:
                raise ConfigError(
                    f"SuperNode {reply.metadata.src_node_id} has num-partitions={nparts} but federation.num_clusters="
                    f"{n_expected}; make the node config and the run config agree"
                )
            if pid in self.node_of_cluster:
                raise ConfigError(f"two SuperNodes claim partition-id={pid}; give each SuperNode its own partition-id")
            self.node_of_cluster[pid] = reply.metadata.src_node_id
            self.examples_of_cluster[pid] = metric_int(info, NUM_EXAMPLES, sender)
            self.labels_of_cluster[pid] = metric_counts(info, LABEL_HISTOGRAM, sender)
        missing = sorted(set(range(n_expected)) - set(self.node_of_cluster))
        if missing:
            raise ConfigError(
                f"no SuperNode has partition-id={missing[0]}; give each of the {n_expected} SuperNodes one id in "
                f"0..{n_expected - 1}"
            )
        log(INFO, "CollaPipe clusters: %s", {n: self.examples_of_cluster[n] for n in sorted(self.node_of_cluster)})

    def release_clusters(self, grid: Grid, timeout_s: float = 60.0) -> int:
        """After the last round: every CU kills this run's device actors (returns how many were released)."""
        if not self.node_of_cluster:
            return 0
        msgs = []
        for cluster, node in sorted(self.node_of_cluster.items()):
            release = ReleaseInstructions(len(self.server.planner.devices_of(cluster)), self.server.cu_state_key)
            msgs.append(Message(release_content(release), dst_node_id=node, message_type=RELEASE))
        released = 0
        for reply in grid.send_and_receive(msgs, timeout=timeout_s):
            if reply.has_error():
                log(
                    WARNING,
                    "SuperNode %s could not release its devices: %s",
                    reply.metadata.src_node_id,
                    reply.error.reason,
                )
                continue
            released += metric_int(
                reply.content.metric_records[RELEASE_REPLY], DEVICE_ACTORS_RELEASED, reply.metadata.src_node_id
            )
        return released

    def partitions(self) -> dict[str, dict[str, Any]]:
        """{cluster n: its partition D_n's size and examples per label} (recorded in every round's record)."""
        return {
            str(n): {"examples": self.examples_of_cluster[n], "labels": list(self.labels_of_cluster.get(n, []))}
            for n in sorted(self.examples_of_cluster)
        }

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        t = server_round + self.round_offset  # Flower counts the rounds of this process from 1
        self._open_round(t)
        if not self.node_of_cluster:
            self.discover_clusters(grid)
        self._host_reading = self.server.read_host_speed()  # before the plan: outside the clock's server part
        t0, cpu0 = time.time(), time.thread_time()
        plan = self.server.planner.plan(t)
        self._server_cpu_s = time.thread_time() - cpu0  # the virtual clock's server part: the plan, then aggregation
        self._decoder_cpu0 = self.server.decoder.head_cpu_seconds()
        self.ledger.note_plan(plan, self.partitions(), time.time() - t0)
        self.server.decoder.open_round(t, [c.cluster for c in plan.selected])
        messages = []
        downloads = self.server.global_model.packed_for([c.cluster for c in plan.selected])
        for cplan in plan.selected:
            weights = downloads[cplan.cluster]
            instructions = self.server.instructions_for(t, cplan, plan.replan_inputs.get(cplan.cluster))
            node = self.node_of_cluster[cplan.cluster]
            messages.append(Message(train_content(weights, instructions), dst_node_id=node, message_type=TRAIN))
        self.ledger.started(self.server.decoder.steps_served if self.server.decoder.host is not None else None)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold each CU's reply into the round's running sum as it arrives (``replies`` is the
        :class:`~collapipe_flwr.fl.server.reply_stream.StreamingGrid`'s generator), then step the global model."""
        t = server_round + self.round_offset
        cluster_of_node = {v: k for k, v in self.node_of_cluster.items()}
        fold = self.server.global_model.new_round()
        clients: dict[int, RoundReport] = {}  # cluster n -> its reply's report, in arrival order
        fold_s, fold_cpu = 0.0, 0.0
        for reply in replies:
            t_fold, cpu_fold = time.time(), time.thread_time()
            self._fold_reply(t, reply, cluster_of_node.get(reply.metadata.src_node_id, -1), fold, clients)
            del reply  # folded in (or refused): its arrays go before the next reply is pulled
            fold_s += time.time() - t_fold
            fold_cpu += time.thread_time() - cpu_fold
        t0 = time.time()
        for cluster in self.ledger.unanswered(set(clients)):
            self.ledger.fail(cluster, "no reply within federation.round_timeout_s")
            log(WARNING, "round %s: cluster %s sent no reply within the round's timeout", t, cluster)
        self.server.decoder.close_round()
        self.ledger.note_wait(t0, fold_s)
        trained = {c: r for c, r in clients.items() if r.steps.count > 0}
        plan = self.ledger.plan
        self.watch.round_ended(t, bool(trained), self.ledger.failures, plan.left_out if plan else {})
        selected = [c.cluster for c in plan.selected] if plan else []
        self.privacy.charge(selected, aggregated=bool(clients) and self.cfg.method.aggregate)
        if not clients:
            log(WARNING, "round %s: no CU returned a result; the global model is unchanged", t)
            return None, None
        cpu0 = time.thread_time()
        self.server.absorb_round(t, fold, {c: r.steps.loss for c, r in clients.items()})
        del fold
        self._note_virtual(clients, fold_cpu + time.thread_time() - cpu0)
        if self.cfg.save_client_weights:
            self.run_log.save_global_weights(t, self.server.global_model.parts())
        self.ledger.note_seconds("aggregate_s", fold_s + time.time() - t0)
        return self._round_metrics(clients)

    def _note_virtual(self, clients: dict[int, RoundReport], aggregate_cpu_s: float) -> None:
        """The round on the virtual clock: each CU's parts, its decoder CPU this round, the plan and aggregation."""
        now = self.server.decoder.head_cpu_seconds()
        decoder = {n: now.get(n, 0.0) - self._decoder_cpu0.get(n, 0.0) for n in now}
        server = self._server_cpu_s + aggregate_cpu_s
        scale = self.server.own_work_scale("server")
        virtual = virtual_round(clients, decoder, server, scale, self.server.host_flops)
        if virtual and self._host_reading is not None:
            virtual["host_reading"] = self._host_reading  # this round's reading; host_flops is the median so far
        self.ledger.note_virtual(virtual)

    def _fold_reply(
        self, t: int, reply: Message, cluster: int, fold: RoundFold, clients: dict[int, RoundReport]
    ) -> None:
        """Read CU ``cluster``'s report, check its reply (reply_checks) and fold it in; a bad reply is the round's
        failure."""
        try:
            weights, metrics = read_reply(reply)
            report = RoundReport.from_record(metrics)
            parts = unpack_weights(weights)
            check_reply(
                parts, report, self.server.global_model.expected_reply(cluster), self.server.max_examples_per_round
            )
            testbed = report.testbed if self.server.planner.uses_profiles else None
            profile = read_profile(testbed.to_record(), t) if testbed is not None else None
            fold.add(cluster, parts, float(report.steps.examples))  # refused whole or folded whole
        except CollaPipeError as err:
            self.ledger.fail(cluster, str(err))
            log(WARNING, "round %s: cluster %s refused: %s (aggregating the other CUs)", t, cluster, err)
            if isinstance(err, CannotContinue):
                self.watch.cannot_continue(t, cluster, str(err))
            return
        if self.cfg.save_client_weights:
            self.run_log.save_cluster_weights(t, cluster, parts, report.steps.examples)
        clients[cluster] = report
        if profile is not None:
            self.ledger.note_profile(cluster, self.server.planner.absorb_profile(cluster, profile).to_dict())

    def _round_metrics(self, clients: dict[int, RoundReport]) -> tuple[ArrayRecord, MetricRecord]:
        """The round's record (example-weighted train loss, each CU's metrics, the overhead) and Flower's return."""
        # what a round costs beyond the CUs' training loops (messages, weight loads, set-up, aggregation)
        self.ledger.note_overhead(max(r.seconds.train for r in clients.values()))
        n_ex = {c: float(r.steps.examples) for c, r in clients.items()}
        total = sum(n_ex.values())
        train_loss = sum(r.steps.loss * n_ex[c] for c, r in clients.items()) / max(total, 1.0)
        self.ledger.note_training(train_loss, clients)
        plan = self.ledger.plan
        if plan is not None:
            self.ledger.note_memory(self.server.planner.absorb_memory(plan, self.server.workload, clients))
        agg = MetricRecord({"train-loss": train_loss, NUM_EXAMPLES: int(total)})
        return self.server.global_model.array_record(), agg

    # ------------------------------------------------------------------ evaluation (server side)
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []  # the server evaluates the full model itself (evaluate_fn)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Centralised evaluation on the validation split (after round 0, every ``eval.every`` rounds and the
        last round) + the round's JSON line (without val_* fields when the round is not evaluated)."""
        if server_round == 0 and self.round_offset:  # a resumed run: round 0 was evaluated by the first process
            return None
        t = server_round + self.round_offset
        t0 = time.time()
        every = self.cfg.eval.every
        due = (t == 0 and self.cfg.eval.at_start) or (t > 0 and t % every == 0) or t >= self.cfg.federation.num_rounds
        metrics = self.server.evaluate() if due else {}
        if t == 0:
            self.ledger.initial(metrics)
            return MetricRecord({k: float(v) for k, v in metrics.items()})
        if not self.ledger.is_open(t):  # a round whose training was never configured
            self._open_round(t, started_at=t0)
        if self.privacy.enabled:
            self.ledger.note_privacy(self.privacy.close_round())
        self.ledger.close(t, metrics, evaluated_since=t0)  # its line, checkpoint, progress, listeners, watch
        trim_heap()  # the round's freed activations and frames back to the kernel (heap_trim.py: ~0.5 GiB a round)
        return MetricRecord({k: float(v) for k, v in metrics.items()}) if metrics else None

    def summary_record(self, result) -> dict:
        """What summary.json holds: the final validation metrics, where the records are, and with privacy on the
        (epsilon, delta) spent."""
        final = {}
        if result is not None and result.evaluate_metrics_serverapp:
            last = max(result.evaluate_metrics_serverapp)
            final = {k: float(v) for k, v in result.evaluate_metrics_serverapp[last].items()}
        summary = {
            "method": self.cfg.method.name,
            "scheduler": self.server.planner.policy_name,
            "task": self.cfg.task.name,
            "num_rounds": self.cfg.federation.num_rounds,
            "final_val": final,
            "rounds_file": str(self.run_log.rounds_path),
        }
        if self.privacy.enabled:  # the (epsilon, delta) spent in total (fl/server/privacy_ledger.py)
            summary["privacy"] = self.privacy.summary(self.cfg.federation.num_rounds)
        return summary

    def summary(self) -> None:
        log(INFO, "\t├── CollaPipe method=%s scheduler=%s", self.cfg.method.name, self.server.planner.policy_name)
        log(INFO, "\t└── clusters N=%s, rounds T=%s", self.cfg.federation.num_clusters, self.cfg.federation.num_rounds)
