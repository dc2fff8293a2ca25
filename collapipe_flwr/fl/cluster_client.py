"""The control unit (CU) of cluster n: one round of local training (Algorithm 1, lines 5-23).

On ``train``: load the global embedding + encoder into this run's session (``cluster_session``: the device
pipeline and optimizer state live across rounds; the pipeline is re-partitioned only when the plan's
delta changes), run the round's local steps — each step: embedding on the CU -> GPipe forward over the
device actors -> z_enc to the head (the server's decoder over the data plane, or a local head for methods
that keep the whole model on the CU) -> dL/dz_enc back -> GPipe backward -> every segment and the
embedding update at the learning-rate schedule's factor for the run-wide step — then concatenate the
segments (⊕, eq. 4) and reply with the encoder and the round's metrics.

``release`` (after the last round): the CU kills this run's device actors and forgets the session.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass

import torch
from flwr.app import RecordDict

from collapipe_flwr import wiring
from collapipe_flwr.config import DATA_DIR_ENV, ClusterConfig, build_cluster_config
from collapipe_flwr.dssra.replan import replan_without
from collapipe_flwr.errors import ConfigError, DeviceFailure, InfeasiblePlanError
from collapipe_flwr.fl import data_parallel
from collapipe_flwr.fl.cluster_session import cached_task, drop_session, existing_session, session_for
from collapipe_flwr.fl.cu_checkpoint import remove_cu_state
from collapipe_flwr.fl.dataplane import DecoderClient
from collapipe_flwr.fl.dataplane.transport import resolve_message_mb
from collapipe_flwr.fl.emulation import (
    ThrottledHead,
    apply_emulation,
    cu_step_seconds,
    uplink_bucket,
    upload,
    with_cu_step,
)
from collapipe_flwr.fl.messages import (
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
    TrainInstructions,
    pack_weights,
    profile_metrics,
    unpack_weights,
)
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.profile import ClusterProfile, DeviceEmulation
from collapipe_flwr.testbed.token_bucket import TokenBucket

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


def hello_metrics(identity: ClusterIdentity, cluster_config: dict) -> dict:
    """Reply to the server's hello: which cluster this is and how many training examples it holds."""
    cfg = build_cluster_config(cluster_config).with_data_dir(identity.data_dir)
    task = cached_task(cfg)
    examples = wiring.client_partition(task, cfg, identity.partition_id, identity.num_partitions)
    return {PARTITION_ID: identity.partition_id, NUM_PARTITIONS: identity.num_partitions, NUM_EXAMPLES: len(examples)}


def decoder_client(cfg: ClusterConfig, instructions: TrainInstructions, cluster: int) -> DecoderClient:
    """The remote head (the server's decoder over the data plane) for this CU's round."""
    return DecoderClient(
        instructions.dataplane_address,
        instructions.dataplane_secret,
        round=instructions.round,
        cluster=cluster,
        compression=cfg.dataplane.wire,
        timeout_s=cfg.dataplane.timeout_s,
        max_message_mb=resolve_message_mb(
            cfg.dataplane.max_message_mb,
            cfg.task.batch_size,
            cfg.model.max_len,
            cfg.model.width,
            cfg.dataplane.wire != "none",
        ),
        root_certificate=instructions.dataplane_root_certificate,
        shared_memory=cfg.dataplane.shared_memory,
    )


def _train_steps(
    session,
    cfg: ClusterConfig,
    instructions: TrainInstructions,
    head,
    m: int,
    num_devices: int,
    cluster: int,
    select=None,
):
    """The round's local steps from its first batch: (losses, examples, seconds per phase, compute per device).
    ``select`` (optional) maps each batch to the rows to train on (a data user's share, ``fl/data_parallel.py``)."""
    pipeline = session.live_pipeline()
    lr_schedule = wiring.lr_schedule(cfg)
    losses: list[float] = []
    step_seconds: dict[str, float] = {}
    device_compute = [0.0] * num_devices
    n_examples = 0
    seed = wiring.round_seed(cfg, instructions.round, cluster)
    for i, batch in enumerate(wiring.train_batches(session.task, cfg, session.examples, seed=seed)):
        if select is not None:
            batch = select(batch)
            if batch is None:  # this data user's share of a short batch is empty
                continue
        factor = lr_schedule(wiring.global_step(cfg, instructions.round, i))
        if isinstance(head, LocalHead):
            head.lr_factor = factor
        result = pipeline.train_step(batch, m, head, lr_factor=factor)
        losses.append(float(result.loss))
        n_examples += int(next(iter(batch.values())).shape[0])
        for phase, sec in result.timings.phases().items():
            step_seconds[phase] = step_seconds.get(phase, 0.0) + sec
        for dev, sec in result.timings.device_compute.items():  # {device index k: compute seconds this step}
            device_compute[int(dev)] += float(sec)
    return losses, n_examples, step_seconds, device_compute


def _train_round(
    session, cfg: ClusterConfig, instructions: TrainInstructions, head, m: int, num_devices: int, cluster: int
):
    """The round's training: one stream of batches through the pipeline, or, when the plan names D > 1 data
    users (VanillaFL read the paper's way), D users each on its share, averaged (``fl/data_parallel.py``)."""
    users = data_parallel.active_users(instructions.plan.data_users, cfg.task.batch_size)
    if users == 1:
        return _train_steps(session, cfg, instructions, head, m, num_devices, cluster)
    if not isinstance(head, LocalHead):
        raise ConfigError(
            f"cluster {cluster}: the plan names {users} data users, which train the whole model on the CU "
            "(head_on_server: false); this method keeps the head on the server, so use a method with a local head"
        )
    return data_parallel.train_data_parallel(
        session.live_pipeline(),
        head,
        users,
        lambda select: _train_steps(session, cfg, instructions, head, m, num_devices, cluster, select),
    )


def _replan_after(
    failure: DeviceFailure, session, parts: dict, instructions: TrainInstructions, lost: list[int], cluster: int
) -> int:
    """Device ``failure.device`` is gone: Sub-1 over the devices left (the server's inputs for this round),
    the round's starting weights back on the new partition; returns the new m. Re-raises when the failed
    device is unknown, no inputs came with the round, or no partition fits the devices left."""
    if failure.device is None or not instructions.replan or failure.device in lost or session.pipeline is None:
        raise failure
    lost.append(int(failure.device))
    try:
        replanned = replan_without(instructions.replan, lost)
    except InfeasiblePlanError as err:
        raise DeviceFailure(f"{failure}; no re-plan over the devices left: {err}", device=failure.device) from None
    log.warning(
        "cluster %s round %s: %s; re-planned over the devices left: S=%s m=%s delta=%s",
        cluster,
        instructions.round,
        failure,
        replanned.S,
        replanned.m,
        list(replanned.delta),
    )
    session.recover(parts, replanned.delta, lost)
    return replanned.m


def run_key_of(cfg: ClusterConfig, run_id: int | None) -> str:
    """Which run a message belongs to: Flower's run id, else (direct calls, tests) a digest of the config."""
    if run_id is not None:
        return str(run_id)
    digest = hashlib.sha1(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    return digest[:12]


def train_round(
    identity: ClusterIdentity,
    weights_record,
    instructions: TrainInstructions,
    state: RecordDict | None = None,
    run_id: int | None = None,
):
    """Run one round on this CU; returns (reply ArrayRecord, metrics dict). ``state`` is Flower's
    ``Context.state`` of this node (the CU's optimizer state travels there between rounds)."""
    t_start = time.time()
    cfg = build_cluster_config(instructions.cluster_config).with_data_dir(identity.data_dir)
    torch.set_num_threads(cfg.runtime.torch_threads)
    run_key = run_key_of(cfg, run_id)
    session = session_for(run_key, identity.partition_id, identity.num_partitions, cfg, state)
    plan = instructions.plan
    devices = [DeviceProfile.from_dict(d) for d in instructions.devices]
    parts = unpack_weights(weights_record)
    head: DecoderClient | LocalHead | ThrottledHead | None = None
    lost: list[int] = []  # devices that failed this round; the CU re-plans over the others (dssra/replan.py)
    m = plan.m
    session.state_key = instructions.cu_state_key
    try:
        try:
            prepared = session.prepare(instructions.round, parts, plan.delta, devices, state)
        except DeviceFailure as failure:  # a device lost since the last round: re-plan before the first step
            m = _replan_after(failure, session, parts, instructions, lost, identity.partition_id)
            prepared = {"pipeline-reused": 1, "blocks-moved": 1, "optimizer-restored": 0}
        t_setup = time.time()
        testbed = _prepare_testbed(session, cfg, instructions, identity.partition_id)
        t_measured = time.time()
        if cfg.head_on_server:
            head = decoder_client(cfg, instructions, identity.partition_id)
            if testbed.bucket is not None:
                head = ThrottledHead(head, testbed.bucket, cfg.dataplane.wire)
        else:
            head = session.local_head
            if head is None:
                raise RuntimeError(f"cluster {identity.partition_id}: no local head though head_on_server=false")
        t_built = time.time()
        while True:
            try:
                run = _train_round(session, cfg, instructions, head, m, len(devices), identity.partition_id)
                break
            except DeviceFailure as failure:
                m = _replan_after(failure, session, parts, instructions, lost, identity.partition_id)
        t_trained = time.time()
        pipeline = session.live_pipeline()
        reply_parts = {"encoder": pipeline.encoder_state_dict()}
        if cfg.federation.embedding == "trained":  # a frozen embedding is not uploaded (eq. 11)
            reply_parts["embedding"] = pipeline.embedding_state_dict()
        if not cfg.head_on_server:
            reply_parts["head"] = {k: v.detach().clone() for k, v in session.model.head.state_dict().items()}
        upload_s = upload(testbed.bucket, reply_parts)
        memory = pipeline.memory_report()
        pids = pipeline.pids()
        t_finish = time.time()
        session.finish(instructions.round, state)  # with the CU's own checkpoint of its moments (cu_checkpoint)
        finish_s = time.time() - t_finish
    except BaseException:
        # a failed round (no device left to re-plan on, data plane refused) leaves no half-trained state behind
        drop_session(run_key, identity.partition_id, len(devices))
        raise
    finally:
        if head is not None and hasattr(head, "close") and not isinstance(head, LocalHead):
            head.close()
    losses, n_examples, step_seconds, device_compute = run
    lr_schedule = wiring.lr_schedule(cfg)
    device_peak = [0.0] * len(devices)  # per device k of the cluster; 0 for devices the plan left idle
    for report in memory:
        device_peak[int(report["device"])] = float(report["peak_bytes"])
    lr_first = lr_schedule(wiring.global_step(cfg, instructions.round, 0))
    metrics = {
        "num-examples": n_examples,
        "train-loss": sum(losses) / max(len(losses), 1),
        "train-loss-first": losses[0] if losses else float("nan"),
        "train-loss-last": losses[-1] if losses else float("nan"),
        "train-losses": [float(x) for x in losses],
        "steps": len(losses),
        "lr-factor-first": lr_first,
        "seconds-setup": t_setup - t_start,
        "seconds-profile": t_measured - t_setup,
        "seconds-build-pipeline": t_built - t_measured,
        "seconds-upload": upload_s,
        "seconds-finish": finish_s,
        "seconds-train": t_trained - t_built,
        "seconds-total": time.time() - t_start,
        "device-peak-bytes": device_peak,
        "device-compute-seconds": device_compute,
        **prepared,
        "device-pids": [int(pids[k]) for k in sorted(pids)],
        # devices lost mid-round and the partition the CU finished on (only when a device failed)
        **(
            {"lost-devices": list(lost), "replanned-delta": list(session.live_pipeline().delta), "replanned-m": m}
            if lost
            else {}
        ),
        **{f"seconds-step-{k}": v for k, v in step_seconds.items()},
        **(
            _testbed_metrics(testbed, head, step_seconds, len(losses), len(devices), instructions.round)
            if instructions.report_profile
            else {}
        ),
    }
    return pack_weights(reply_parts), metrics


@dataclass
class _Testbed:
    """What this round's testbed and measurement set up: the uplink bucket, the cores each device's cgroup
    grants, and the devices' profile when the server asked for one."""

    bucket: TokenBucket | None = None
    cores: list[float] | None = None
    profile: ClusterProfile | None = None


def _prepare_testbed(session, cfg: ClusterConfig, instructions: TrainInstructions, cluster: int) -> _Testbed:
    """Apply the testbed's quotas and link throttles (when the server sends them), then measure the devices and
    links (when asked) at the shape of this round's first batch: measured under the emulation, as the round runs."""
    out = _Testbed()
    pipeline = session.live_pipeline()
    if instructions.emulation:
        emulation = DeviceEmulation.from_dict(instructions.emulation)
        out.cores = apply_emulation(pipeline, emulation, cluster)
        out.bucket = uplink_bucket(emulation)
    else:
        pipeline.clear_testbed()
    if instructions.measure:
        seed = wiring.round_seed(cfg, instructions.round, cluster)
        first = next(iter(wiring.train_batches(session.task, cfg, session.examples, seed=seed)))
        b, seq_len = (int(x) for x in first["input_ids"].shape[:2])
        out.profile = pipeline.measure(b, seq_len, cfg.model.width, repeats=instructions.measure)
    return out


def _testbed_metrics(testbed: _Testbed, head, step_seconds: dict, steps: int, K: int, t: int) -> dict:
    """The reply's profile (every round: the CU's own seconds per step; devices and links when measured) and the
    cores the testbed's cgroups granted."""
    waited = head.waited_s if isinstance(head, ThrottledHead) else 0.0
    report = with_cu_step(testbed.profile, K, cu_step_seconds(step_seconds, steps, waited), t)
    out = profile_metrics(report)
    out["seconds-uplink-wait"] = waited
    if testbed.cores is not None:
        out["testbed-cpu-cores"] = testbed.cores
    return out


def release_run(identity: ClusterIdentity, run_key: str, num_devices: int, state_key: str = "") -> int:
    """The run is over for this CU: kill its device actors, forget its session and remove its on-disk moments
    (the run finished: nothing will resume it). ``state_key`` comes with the release message, since the process
    handling it need not be the one that trained (Flower's simulation pool)."""
    session = existing_session(run_key, identity.partition_id)
    for key in {state_key, session.state_key if session is not None else ""} - {""}:
        remove_cu_state(key, identity.partition_id)
    return drop_session(run_key, identity.partition_id, num_devices)
