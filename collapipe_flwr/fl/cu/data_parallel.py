"""VanillaFL's round on the CU the paper's way: D data users, each training the whole model on its own share.

The paper's VanillaFL is "a standard FL approach that uses simple averaging for model aggregation, without any
model partitioning" (Section VI.A), whose devices are all data users (Table III). The plan says how many
(``ClusterPlan.data_users`` = D, from ``ClusterModel.data_users``: the devices that hold the whole model, C7,
and train it on their share within E_k^max, C9'). In round t each user d = 0..D-1:

1. starts from the round's global model (theta^enc, the embedding and the head) and the CU's optimizer
   moments at the start of the round;
2. runs the round's local steps on its share of each of the cluster's batches: rows
   ``torch.tensor_split(batch, D)[d]`` (sizes ceil(b/D) or floor(b/D); the delay model counts ceil(b/D));
3. hands its model to the CU, which averages the D models weighted by the examples each trained on
   (FedAvg inside the cluster, eq. (5)'s "simple averaging") and uploads that one model.

The users' optimizer moments are averaged the same way (the CU keeps one optimizer state per cluster across
rounds, ``federation.optimizer_state: keep``; with ``reset`` every user starts each round fresh anyway). The
average is the server's own weighted mean (``fl/weighted_mean.py``: :class:`TreeMean` over one ``WeightedSum``,
the one FedAvg of the CUs and the server).

User d trains on its own device, ``ClusterPlan.user_devices[d]`` (the whole encoder is moved there with the
pipeline's ``placement.repartition`` before its steps, under that device's CPU quota and memory limit on the testbed),
one user after another: the paper's users run in parallel, each on its own device, and a machine with fewer cores
than devices cannot run them so without slowing each one. Each user's seconds are measured apart: its steps
(``StepLog.user_seconds``, metric ``seconds-users``) and its hand-over (the model moved to its device and its
start state loaded, then its model read back into the CU's sum: ``user_handover_seconds``, metric
``seconds-users-handover``), and the CU's final average apart (``average_seconds``, ``seconds-users-average``),
so the parallel round is read as the slowest user's hand-over and steps plus the average, as the delay model
counts the slowest user (``ClusterModel.evaluate_data_parallel``). A plan without ``user_devices`` (D = 1, or
a plan from before they were named) runs every user on the device delta names. Nothing crosses the data
plane: VanillaFL keeps the head on the CU (``head_on_server: false``).

Written by hand: the state to snapshot spans the CU's embedding, the device stages (local or Ray) and the
local head, which no library's data-parallel wrapper (DDP needs one process per replica and averages
gradients every step, not models after local steps) covers.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.fl.weighted_mean import TreeMean
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead


@dataclass
class TrainingState:
    """What a data user changes in a round: weights and optimizer moments of every part it trains."""

    embedding: dict[str, torch.Tensor]
    embedding_optimizer: dict
    encoder: dict[str, torch.Tensor]
    encoder_optimizer: dict[str, dict]
    head: dict[str, torch.Tensor]
    head_optimizer: dict


def snapshot(pipeline: ClusterPipeline, head: LocalHead) -> TrainingState:
    """A deep copy of the CU's training state (weights and optimizer moments), on the CPU."""
    head_optimizer = head.optimizer.state_dict() if head.optimizer is not None else {}
    return TrainingState(
        embedding=pipeline.embedding_state_dict(),
        embedding_optimizer=copy.deepcopy(pipeline.step.embedding_optimizer.state_dict()),
        # copies: on the local backend a stage hands out its live tensors
        encoder={k: v.detach().clone() for k, v in pipeline.encoder_state_dict().items()},
        encoder_optimizer=copy.deepcopy(pipeline.placement.encoder_optimizer_state()),
        head={k: v.detach().clone() for k, v in head.head.state_dict().items()},
        head_optimizer=copy.deepcopy(head_optimizer),
    )


def restore(pipeline: ClusterPipeline, head: LocalHead, state: TrainingState) -> None:
    """Put ``state`` back: weights, and optimizer moments over fresh optimizers (so that no moment of the
    previous user survives where ``state`` has none, e.g. before the first step of a run)."""
    pipeline.load_embedding_state_dict(state.embedding)
    pipeline.load_encoder_state_dict(state.encoder)
    pipeline.reset_optimizers()
    if state.embedding_optimizer.get("state"):
        pipeline.step.embedding_optimizer.load_state_dict(copy.deepcopy(state.embedding_optimizer))
    if state.encoder_optimizer:
        pipeline.placement.load_encoder_optimizer_state(state.encoder_optimizer)
    head.head.load_state_dict(state.head)
    head.reset_optimizer()
    if head.optimizer is not None and state.head_optimizer.get("state"):
        head.optimizer.load_state_dict(copy.deepcopy(state.head_optimizer))


def user_share(batch: dict[str, torch.Tensor], user: int, users: int) -> dict[str, torch.Tensor] | None:
    """Data user ``user``'s rows of a batch: ``torch.tensor_split(rows, users)[user]`` of every tensor; None
    when the batch has fewer rows than users and this user's share is empty (an epoch's last, short batch:
    that user skips the step)."""
    share = {key: torch.tensor_split(value, users)[user] for key, value in batch.items()}
    return share if all(v.shape[0] for v in share.values()) else None


def active_users(data_users: int, batch_size: int) -> int:
    """How many users train: D, but no more than the batch has rows (each user needs one example)."""
    return max(1, min(int(data_users), int(batch_size)))


Select = Callable[[dict[str, torch.Tensor]], "dict[str, torch.Tensor] | None"]
TrainUser = Callable[[Select], StepLog]


def whole_model_on(device: int, num_devices: int, num_blocks: int) -> tuple[int, ...]:
    """delta with all L blocks on ``device`` (S = 1): where data user d trains."""
    return tuple(num_blocks if k == device else 0 for k in range(num_devices))


def train_data_parallel(
    pipeline: ClusterPipeline,
    head: LocalHead,
    users: int,
    train_user: TrainUser,
    user_devices: Sequence[int] = (),
) -> StepLog:
    """Run the round for ``users`` data users and leave their average in the pipeline and the head.

    ``train_user(select)`` runs the round's local steps with every batch passed through ``select`` and
    returns ``(losses, examples, seconds per phase, compute per device)``. ``user_devices[d]``: the device user
    d trains on (the encoder moves there first; empty: every user on the pipeline's present layout). Returns
    the round's log: per step the example-weighted mean loss over the users, the users' examples, seconds and
    device compute summed, each user's seconds and, with ``user_devices``, each user device's memory report.
    """
    if user_devices and len(user_devices) < users:
        raise ValueError(f"{users} data users but {len(user_devices)} user devices: name one device per user")
    home = pipeline.placement.delta
    start = snapshot(pipeline, head)
    mean = TreeMean()
    runs: list[StepLog] = []
    user_seconds: list[float] = []
    memory: list[dict] = []
    handover_seconds: list[float] = []
    for d in range(users):
        handed = time.perf_counter()
        if user_devices:
            pipeline.placement.repartition(whole_model_on(int(user_devices[d]), len(home), sum(home)))
        if d:
            restore(pipeline, head, start)
        began = time.perf_counter()
        runs.append(train_user(functools.partial(user_share, user=d, users=users)))
        ended = time.perf_counter()
        user_seconds.append(ended - began)
        if user_devices:
            memory.extend(pipeline.memory_report())  # this user's device, its peaks read (and reset) now
        mean.add(vars(snapshot(pipeline, head)), float(runs[-1][1]))
        # user d's own hand-over: the model moved to its device and its start state loaded, then its model read
        # back into the CU's running sum -- what its own device and the CU's link would do beside the others'
        handover_seconds.append(began - handed + time.perf_counter() - ended)
    averaged = time.perf_counter()
    if user_devices:
        pipeline.placement.repartition(home)
    restore(pipeline, head, TrainingState(**mean.mean()))
    average_seconds = time.perf_counter() - averaged
    merged = _merged(runs)
    return merged._replace(
        user_seconds=tuple(user_seconds),
        memory=tuple(memory),
        user_handover_seconds=tuple(handover_seconds),
        average_seconds=average_seconds,
    )


def _merged(runs: Sequence[StepLog]) -> StepLog:
    """The D users' logs as one: per step the example-weighted mean loss, the examples, seconds per phase and
    compute per device summed; each user's step calls apart (the virtual clock runs the users at once)."""
    examples = [float(run[1]) for run in runs]
    steps = min(len(run[0]) for run in runs)
    losses = [sum(run[0][i] * n for run, n in zip(runs, examples)) / sum(examples) for i in range(steps)]
    seconds: dict[str, float] = {}
    compute = [0.0] * len(runs[0][3])
    for run in runs:
        for phase, sec in run[2].items():
            seconds[phase] = seconds.get(phase, 0.0) + sec
        compute = [a + b for a, b in zip(compute, run[3])]
    return StepLog(losses, int(sum(examples)), seconds, compute, user_calls=tuple(run.calls for run in runs))
