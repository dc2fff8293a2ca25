"""The control unit (CU) of cluster n: one round of local training (Algorithm 1, lines 5-23).

On ``train``: load the global embedding + encoder into this run's session (``cluster_session``, kept by the
process's ``CUStateStore``, ``state_store``: the device pipeline and optimizer state live across rounds, their
moments also in the round's moment stores, ``moments``; the pipeline is re-partitioned only when the plan's
delta changes), run the round's local steps — each step: embedding on the CU -> GPipe forward over the
device actors -> z_enc to the head (the server's decoder over the data plane, or a local head for methods
that keep the whole model on the CU) -> dL/dz_enc back -> GPipe backward -> every segment and the
embedding update at the learning-rate schedule's factor for the run-wide step — then concatenate the
segments (⊕, eq. 4) and reply with the encoder and the round's metrics. ``train_round`` reads the round
top-down; its parts: ``local_steps`` (the steps and their lr factors), ``device_loss`` (the re-plan after a
lost device), ``round_testbed`` (the testbed and the devices' profile), ``round_metrics`` (the figures of the reply's
RoundReport, ``fl/round_report.py``).

``release`` (after the last round): the CU kills this run's device actors and forgets the session.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from flwr.app import RecordDict

from collapipe_flwr import wiring
from collapipe_flwr.config import DATA_DIR_ENV, ClusterConfig, build_cluster_config
from collapipe_flwr.errors import ConfigError, DeviceFailure
from collapipe_flwr.fl.cu.cluster_session import ClusterSession
from collapipe_flwr.fl.cu.device_loss import plan_without_lost, replan_after
from collapipe_flwr.fl.cu.emulation import ThrottledHead, upload
from collapipe_flwr.fl.cu.local_steps import LocalRound, train_local_steps
from collapipe_flwr.fl.cu.moments import DiskMoments, MomentStore, round_moments
from collapipe_flwr.fl.cu.planned_memory import planned_caps
from collapipe_flwr.fl.cu.round_metrics import (
    DeviceReport,
    RoundClock,
    device_report,
    step_figures,
    virtual_figures,
)
from collapipe_flwr.fl.cu.round_testbed import RoundTestbed, prepare_testbed, testbed_figures
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.transport import resolve_message_mb
from collapipe_flwr.fl.messages import (
    LABEL_HISTOGRAM,
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
    TrainInstructions,
    pack_weights,
    unpack_weights,
)
from collapipe_flwr.fl.round_report import Preparation, RoundReport, RoundSeconds, TestbedFigures, VirtualFigures
from collapipe_flwr.heap_trim import trim_heap
from collapipe_flwr.models.trainable import only_trainable, tensor_bytes, with_frozen
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.system.devices import DeviceProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterIdentity:
    """Which cluster this CU is, from its node config (simulation and deployment alike)."""

    partition_id: int
    num_partitions: int
    data_dir: str = ""

    @classmethod
    def from_node_config(cls, node_config) -> ClusterIdentity:
        try:
            pid = int(node_config["partition-id"])
            nparts = int(node_config["num-partitions"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                "this SuperNode has no partition-id/num-partitions; start it with "
                '--node-config "partition-id=0 num-partitions=2"'
            ) from None
        if not 0 <= pid < nparts:
            raise ConfigError(f"partition-id={pid} must be in 0..{nparts - 1}; fix the SuperNode's --node-config")
        # This box's data: its node config, else its own COLLAPIPE_DATA_DIR, else the run's data_dir.
        data_dir = str(node_config.get("data-dir", "") or os.environ.get(DATA_DIR_ENV, "") or "")
        return cls(pid, nparts, data_dir)


def hello_metrics(store: CUStateStore, identity: ClusterIdentity, cluster_config: dict) -> dict:
    """Reply to the server's hello: which cluster this is, how many training examples it holds and how many of
    them carry each label (``Task.partition_labels``: the histogram rounds.jsonl records per partition)."""
    cfg = build_cluster_config(cluster_config).with_data_dir(identity.data_dir)
    task = store.cached_task(cfg)
    examples = wiring.client_partition(task, cfg, identity.partition_id, identity.num_partitions)
    labels = task.partition_labels() or []
    counts = Counter(labels[i] for i in examples) if labels else Counter()
    histogram = [counts[label] for label in range(max(labels) + 1)] if labels else []
    return {
        PARTITION_ID: identity.partition_id,
        NUM_PARTITIONS: identity.num_partitions,
        NUM_EXAMPLES: len(examples),
        LABEL_HISTOGRAM: histogram,
    }


def decoder_client(cfg: ClusterConfig, instructions: TrainInstructions, cluster: int) -> DecoderClient:
    """The remote head (the server's decoder over the data plane) for this CU's round."""
    spec = DecoderClientSpec(
        timeout_s=cfg.dataplane.timeout_s,
        max_message_mb=resolve_message_mb(
            cfg.dataplane.max_message_mb,
            cfg.task.batch_size,
            cfg.model.max_len,
            cfg.model.width,
            cfg.dataplane.compression,
        ),
        compression=cfg.dataplane.compression,
        shared_memory=cfg.dataplane.shared_memory,
        transport=cfg.dataplane.transport,
    )
    return DecoderClient(
        instructions.dataplane_address,
        instructions.dataplane_secret,
        round=instructions.round,
        cluster=cluster,
        spec=spec,
        root_certificate=instructions.dataplane_root_certificate,
    )


def run_key_of(cfg: ClusterConfig, run_id: int | None) -> str:
    """Which run a message belongs to: Flower's run id, else (direct calls, tests) a digest of the config."""
    if run_id is not None:
        return str(run_id)
    digest = hashlib.sha1(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    return digest[:12]


@dataclass
class CuRound:
    """One round on cluster n's CU: what its parts read. ``parts`` are the round's global weights (theta^enc,
    the embedding, a CU-side head), the start of every re-plan; ``m`` is the plan's, or the last re-plan's;
    ``lost`` the devices that failed this round; ``moments`` where the round's optimizer moments come from and
    go to (fl/cu/moments.py)."""

    cfg: ClusterConfig
    instructions: TrainInstructions
    cluster: int
    devices: list[DeviceProfile]
    session: ClusterSession
    parts: dict[str, dict[str, torch.Tensor]]
    m: int
    moments: tuple[MomentStore, ...] = ()
    lost: list[int] = field(default_factory=list)
    lost_reasons: list[str] = field(default_factory=list)  # per lost device: "memory" (killed by the kernel) or ""


def train_round(
    store: CUStateStore,
    identity: ClusterIdentity,
    weights_record,
    instructions: TrainInstructions,
    state: RecordDict | None = None,
    run_id: int | None = None,
):
    """Run one round on this CU (Algorithm 1, lines 5-23); returns (reply ArrayRecord, its RoundReport). ``store``:
    this CU process's sessions; ``state``: this node's ``Context.state`` (the CU's moments travel there too).

    1. the session loads the global weights and takes the plan's partition delta (re-planning at once when a
       device was lost since the last round); 2. the testbed's quotas and throttles, and the devices' profile when
       the server asks; 3. the head: the server's decoder over the data plane, or the CU's own; 4. the
       ``federation.local_steps`` GPipe steps, re-planned over the devices left when one fails; 5. the reply:
       theta^enc = theta^1 (+) ... (+) theta^S (eq. 4), the embedding and a CU-side head, uploaded at R_n on the
       testbed; 6. the CU keeps its optimizer moments. A failed round leaves no half-trained state behind."""
    clock = RoundClock(start=time.time())
    run = _open_round(store, identity, weights_record, instructions, state, run_id)
    head: DecoderClient | ThrottledHead | LocalHead | None = None
    try:
        prepared = _prepare(run)
        clock.setup = time.time()
        testbed = prepare_testbed(run.session, run.cfg, instructions, run.cluster)
        clock.measured = time.time()
        head = _round_head(run, testbed)
        clock.built = time.time()
        steps = _train_with_replans(run, head)
        clock.trained = time.time()
        reply_parts = _reply_parts(run)
        # without aggregation (PipeLine) the weights go back only so that the server can evaluate and checkpoint
        # each cluster's own model: no emulated uplink, no upload bytes (eq. 11 charges such a method z_enc only)
        clock.upload_s = upload(testbed.bucket if run.cfg.aggregated else None, reply_parts)
        devices = _device_report(run, steps)
        clock.finish_s = _finish(run)
    except BaseException:
        store.drop_session(run.session.run_key, run.cluster, len(run.devices))
        raise
    finally:
        if isinstance(head, (DecoderClient, ThrottledHead)):  # a remote head's connection ends with the round
            head.close()
        trim_heap()  # the round's freed activations back to the kernel (heap_trim.py)
    upload_bytes = tensor_bytes(reply_parts) if run.cfg.aggregated else 0
    seconds = clock.seconds(time.time())
    report = RoundReport(
        steps=step_figures(steps, wiring.lr_clock(run.cfg).factor(instructions.round, 0)),
        seconds=seconds,
        devices=devices.figures(steps),
        preparation=prepared,
        # what the reply's tensors hold (eq. 11's model term, uncompressed); 0 for a method without aggregation,
        # whose weights travel back for evaluation only (``carried_bytes``)
        upload_bytes=upload_bytes,
        carried_bytes=None if run.cfg.aggregated else tensor_bytes(reply_parts),
        replan=devices.replan(),
        virtual=_virtual_figures(run, steps, seconds, upload_bytes),
        testbed=_testbed_figures(run, testbed, head, steps),
    )
    return pack_weights(reply_parts), report


def _testbed_figures(run: CuRound, testbed: RoundTestbed, head, steps: StepLog) -> TestbedFigures | None:
    """The round's testbed figures (fl/cu/round_testbed.py), when the server asks for the devices' profile."""
    if not run.instructions.report_profile:
        return None
    return testbed_figures(testbed, head, steps.seconds, len(steps.losses), len(run.devices), run.instructions.round)


def _virtual_figures(run: CuRound, steps: StepLog, seconds: RoundSeconds, upload_bytes: int) -> VirtualFigures | None:
    """The round on the virtual clock (fl/cu/round_metrics.py: virtual_figures), its set-up and profiling as
    measured."""
    setup_s = seconds.setup + seconds.profile + seconds.build_pipeline
    cfg = run.cfg
    return virtual_figures(
        steps, run.instructions.clock, cfg.pipeline.schedule, cfg.head_on_server, setup_s, upload_bytes
    )


def _open_round(
    store: CUStateStore,
    identity: ClusterIdentity,
    weights_record,
    instructions: TrainInstructions,
    state: RecordDict | None,
    run_id: int | None,
) -> CuRound:
    """The round's config (this box's data folder), torch threads, this run's session, the global weights and
    where the round's optimizer moments live (``Context.state``; the disk when the server keeps a checkpoint)."""
    cfg = instructions.cluster_config.with_data_dir(identity.data_dir)
    torch.set_num_threads(cfg.runtime.torch_threads)
    cluster = identity.partition_id
    session = store.session_for(run_key_of(cfg, run_id), cluster, identity.num_partitions, cfg, state)
    session.state_key = instructions.cu_state_key
    moments = round_moments(state, session.run_key, cluster, session.state_key)
    devices = instructions.devices
    parts = unpack_weights(weights_record)
    if cfg.model.adapters_only:  # LoRA: after its first download a CU gets the trainable tensors only
        parts = with_frozen(parts, _held_parts(session, cfg))
    return CuRound(cfg, instructions, cluster, devices, session, parts, instructions.plan.m, moments)


def _prepare(run: CuRound) -> Preparation:
    """Load the weights and take delta (re-planned when it gives blocks to a device this CU lost in an earlier
    round); a device lost since the last round: re-plan before the first step."""
    pipeline = run.session.pipeline
    gone = pipeline.lost_devices if pipeline is not None else ()
    try:
        delta, run.m = plan_without_lost(run.instructions, gone, run.lost, run.lost_reasons, run.cluster)
        prepared = run.session.prepare(run.instructions.round, run.parts, delta, run.devices, run.moments)
    except DeviceFailure as failure:
        run.m = replan_after(failure, run.session, run.parts, run.instructions, run.lost, run.cluster)
        run.lost_reasons.append(failure.reason)
        prepared = Preparation(pipeline_reused=True, blocks_moved=True, optimizer_restored=False)
    _take_planned_caps(run)
    return prepared


def _take_planned_caps(run: CuRound) -> None:
    """C7 for the partition the pipeline now holds, as the planner computed it (fl/cu/planned_memory.py)."""
    pipeline = run.session.live_pipeline()
    pipeline.placement.planned_caps = planned_caps(run.instructions, pipeline.placement.delta, run.m)


def _round_head(run: CuRound, testbed: RoundTestbed) -> DecoderClient | ThrottledHead | LocalHead:
    """The server's decoder over the data plane (behind the uplink's token bucket on the testbed), or the CU's
    own head (methods that keep the whole model on the CU)."""
    if run.cfg.head_on_server:
        remote = decoder_client(run.cfg, run.instructions, run.cluster)
        return (
            ThrottledHead(remote, testbed.bucket, run.cfg.dataplane.compression)
            if testbed.bucket is not None
            else remote
        )
    if run.session.local_head is None:
        raise RuntimeError(f"cluster {run.cluster}: no local head though head_on_server=false")
    return run.session.local_head


def _train_with_replans(run: CuRound, head: DecoderClient | ThrottledHead | LocalHead) -> StepLog:
    """The round's local steps; a device that fails mid-round is re-planned around and the round starts again
    from its global weights on the devices left (``fl/cu/device_loss.py``), and the server's decoder from the round's
    start without the aborted attempt's steps (``restart_attempt``; a CU-side head is reset by the re-plan)."""
    while True:
        try:
            plan = run.instructions.plan
            at = LocalRound(run.instructions.round, run.cluster, run.m, plan.data_users, len(run.devices))
            if not run.lost:  # after a device loss the re-plan is a pipeline over the devices left
                at = dataclasses.replace(at, user_devices=plan.user_devices)
            return train_local_steps(
                run.session.live_pipeline(), head, run.cfg, run.session.task, run.session.examples, at
            )
        except DeviceFailure as failure:
            run.m = replan_after(failure, run.session, run.parts, run.instructions, run.lost, run.cluster)
            run.lost_reasons.append(failure.reason)
            _take_planned_caps(run)
            if isinstance(head, (DecoderClient, ThrottledHead)):  # the server's decoder forgets the aborted attempt
                head.restart_attempt()


def _held_parts(session: ClusterSession, cfg: ClusterConfig) -> dict[str, torch.nn.Module]:
    """The modules of the parts a CU downloads: the embedding, the TEBs, and the head when it trains it."""
    model = session.model
    held = {"embedding": model.embedding, "encoder": model.blocks}
    if not cfg.head_on_server:
        held["head"] = model.head
    return held


def _reply_parts(run: CuRound) -> dict[str, dict[str, torch.Tensor]]:
    """theta^enc (eq. 4), the embedding unless frozen (eq. 11 then leaves it out), and a CU-side head; under LoRA
    (``model.lora.enabled``) only their trainable tensors, the adapters theta^s_LoRA of every delta_k."""
    pipeline = run.session.live_pipeline()
    parts = {"encoder": pipeline.encoder_state_dict()}
    if wiring.embedding_travels(run.cfg):
        parts["embedding"] = pipeline.embedding_state_dict()
    if not run.cfg.head_on_server:
        parts["head"] = {k: v.detach().clone() for k, v in run.session.model.head.state_dict().items()}
    if run.cfg.model.adapters_only:
        parts = only_trainable(parts, _held_parts(run.session, run.cfg))
    return parts


def _device_report(run: CuRound, steps: StepLog) -> DeviceReport:
    """Per device k: memory (a data-parallel round's from each user device right after its steps), pids, losses; an
    idle device found dead counts as lost (``lost-devices``) without failing the round."""
    pipeline = run.session.live_pipeline()
    memory = list(steps.memory) or pipeline.memory_report()
    report = device_report(memory, pipeline.stages.processes(), len(run.devices))
    for failure in pipeline.take_idle_losses():  # held no blocks: took no part in the steps, the round stands
        log.warning("cluster %s round %s: %s; it held no blocks", run.cluster, run.instructions.round, failure)
        if failure.device is not None:
            run.lost.append(failure.device)
            run.lost_reasons.append(failure.reason)
    if run.lost:
        report.lost, report.final_delta, report.final_m = list(run.lost), list(pipeline.placement.delta), run.m
        report.lost_reasons = list(run.lost_reasons)
    return report


def _finish(run: CuRound) -> float:
    """The session keeps this round's state, and the round's moment stores its moments (Context.state, the CU's
    own checkpoint); returns its seconds."""
    start = time.time()
    run.session.finish(run.instructions.round, run.moments)
    return time.time() - start


def release_run(
    store: CUStateStore, identity: ClusterIdentity, run_key: str, num_devices: int, state_key: str = ""
) -> int:
    """The run is over for this CU: kill its device actors, forget its session in ``store`` and remove its on-disk
    moments (the run finished: nothing will resume it). ``state_key`` comes with the release message, since the
    process handling it need not be the one that trained (Flower's simulation pool)."""
    session = store.existing_session(run_key, identity.partition_id)
    for key in {state_key, session.state_key if session is not None else ""} - {""}:
        DiskMoments(key, identity.partition_id).discard()
    return store.drop_session(run_key, identity.partition_id, num_devices)
