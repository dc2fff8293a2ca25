"""What the edge server holds for a run, built once from the config: each part does one job.

- :class:`~collapipe_flwr.fl.server.aggregation.global_model.GlobalModel`: theta^emb + theta^enc that CUs
  download and that aggregation replaces (eqs. 6-9);
- :class:`~collapipe_flwr.fl.server.round_planner.RoundPlanner`: the round's channel/device state and the
  scheduling policy that turns it into a plan X(t) (eq. 27), whose queues Y_n it updates (eq. 29);
- :class:`~collapipe_flwr.fl.server.decoder.service.DecoderService`: the decoder / task head and its optimizer,
  served to the CUs over the data plane and trained on the server from every CU's activations;
- :class:`~collapipe_flwr.fl.server.evaluator.Evaluator`: the full model on the validation split.
The strategy (``fl/server/strategy.py``) only speaks Flower and drives these parts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from collapipe_flwr import wiring
from collapipe_flwr.accelerator import resolve_device
from collapipe_flwr.config import FederationSpec, RunConfig
from collapipe_flwr.dssra.methods import make_planner
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.dssra.replan import Sub1Inputs
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.messages import TrainInstructions
from collapipe_flwr.fl.server.aggregation.global_model import GlobalModel, RoundFold
from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.fl.server.decoder.service import DecoderService, TlsFiles
from collapipe_flwr.fl.server.evaluator import Evaluator
from collapipe_flwr.fl.server.preflight import check_partitions
from collapipe_flwr.fl.server.round_planner import RoundPlanner
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.pipeline.profiling import host_flop_rate
from collapipe_flwr.precision import resolve_precision
from collapipe_flwr.system.state import StateSampler
from collapipe_flwr.system.workload import RoundShape, Workload, measure_workload
from collapipe_flwr.tasks.base import Task
from collapipe_flwr.testbed import cpu_quota_available, memory_available

PROBE_EXAMPLES = 8  # FLOPs and bytes are counted per sample, so a few real examples suffice


def sample_hidden(task: Task, model: SplitModel, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A few real training examples through the embedding: the activations the workload is counted on."""
    n = min(PROBE_EXAMPLES, wiring.batch_size(cfg), len(task.train_examples()))
    batch = next(iter(task.batches(list(range(n)), n, seed=cfg.seed, shuffle=False)))
    with torch.no_grad():
        hidden = model.embedding(batch["input_ids"])
    return hidden, batch["attention_mask"]


def decoder_lr_factor(cfg: RunConfig) -> Callable[[int, int], float]:
    """The decoder's lr factor for step ``seq`` (1, 2, ...) of round t: the same run-wide step clock as the CUs'."""
    clock = wiring.lr_clock(cfg)
    return lambda round_, seq: clock.factor(round_, max(0, int(seq) - 1))


def count_workload(model: SplitModel, hidden: torch.Tensor, mask: torch.Tensor, cfg: RunConfig) -> Workload:
    """FLOPs and bytes of a round (the workload the policy plans with), counted on ``hidden``."""
    round_shape = RoundShape(
        batch_size=wiring.batch_size(cfg),
        steps_per_round=cfg.federation.local_steps,
        schedule=cfg.pipeline.schedule,  # C7's activation term (Workload.block_memory_bytes)
        checkpoint=cfg.pipeline.checkpoint,  # and its re-materialization (Workload.stage_memory_bytes)
    )
    return measure_workload(
        model.blocks,
        hidden,
        mask,
        round_shape=round_shape,
        embedding=model.embedding if wiring.embedding_travels(cfg) else None,  # uploaded or not
        head=model.head,
    )


def measure_host_flops(
    model: SplitModel, workload: Workload, hidden: torch.Tensor, mask: torch.Tensor, cfg: RunConfig
) -> float:
    """The virtual clock's host speed (``clock.host_flops: 0``): one thread's FLOP/s on the first TEB's forward +
    backward over the workload's probe, at the devices' precision (pipeline/profiling.py: host_flop_rate)."""
    flops = (workload.forward_flops[0] + workload.backward_flops[0]) * int(hidden.shape[0])
    precision = resolve_precision(cfg.runtime.precision, "cpu")
    return host_flop_rate(model.blocks[0], hidden, mask, flops, precision)


@dataclass(frozen=True)
class Probe:
    """What the server counts a round's workload and the host's speed on: the task, the model, a few real examples'
    activations after the embedding (``sample_hidden``) and the workload counted on them."""

    task: Task
    model: SplitModel
    hidden: torch.Tensor
    mask: torch.Tensor
    workload: Workload

    @classmethod
    def build(cls, cfg: RunConfig) -> Probe:
        """The start-up's first steps, in order: the partition check, the model, the probe, the workload."""
        torch.manual_seed(cfg.seed)
        task = wiring.build_task(cfg)
        # the clusters' partitions first: data too small for them is one line here, not the probe's index error
        check_partitions(task, cfg.federation.num_clusters, cfg.task.batch_size)
        model = wiring.build_model(task, cfg)
        hidden, mask = sample_hidden(task, model, cfg)
        return cls(task, model, hidden, mask, count_workload(model, hidden, mask, cfg))

    def host_flops(self, cfg: RunConfig) -> float:
        """One reading of the virtual clock's host speed (``measure_host_flops``): at start-up, and at each round's
        start with ``clock.probe_every_round``."""
        return measure_host_flops(self.model, self.workload, self.hidden, self.mask, cfg)


def check_testbed(cfg: RunConfig) -> None:
    """The emulated testbed's CPU quotas and memory limits need cgroups: refuse at start-up, before any CU trains
    unthrottled or unlimited."""
    if cfg.testbed.enabled and cfg.testbed.cpu_quota and (reason := cpu_quota_available()) is not None:
        raise ConfigError(
            f"testbed=emulated needs cgroup CPU quotas on this host: {reason}; "
            "run as root on Linux, or set testbed.cpu_quota=false (links throttled only)"
        )
    wants_memory = cfg.testbed.enabled and cfg.testbed.memory_limit or cfg.runtime.memory_cgroup
    if wants_memory and (reason := memory_available()) is not None:
        raise ConfigError(
            f"testbed.memory_limit / runtime.memory_cgroup need memory cgroups on this host: {reason}; "
            "run as root on Linux, or set testbed.memory_limit=false"
        )


def build_planner(cfg: RunConfig, workload: Workload) -> RoundPlanner:
    """The round planner: the method's scheduling policy over the sampled channel/device state."""
    network = cfg.network.sized_to(workload.encoder_memory_bytes)  # device.memory_share: gamma_k^max of this model
    policy = make_planner(cfg.method, cfg.scheduler, network, workload, cfg.seed)
    return RoundPlanner(network, StateSampler(network, cfg.seed), policy, cfg.scheduler.name, cfg.system, cfg.testbed)


def start_decoder(cfg: RunConfig, model: SplitModel, hidden_size: int, precision: str) -> DecoderService:
    """The decoder / task head and its optimizer, served to the CUs over the data plane."""
    dp = cfg.dataplane
    # the host's settings; None when the method trains the head on the CU (no data plane)
    spec: DecoderHostSpec | None = None
    if cfg.method.head_on_server:
        spec = DecoderHostSpec.from_config(cfg, hidden_size=hidden_size, precision=precision)
    return DecoderService.start(
        model.head,
        wiring.optimizer_spec(cfg).build(model.head.parameters()),
        spec,
        announce_host=dp.host,
        lr_factor_of=decoder_lr_factor(cfg),
        tls=TlsFiles(dp.tls_cert, dp.tls_key, dp.tls_ca) if dp.tls_cert else None,
    )


def make_server_optimizer(fed: FederationSpec) -> ServerOptimizer:
    """The server step on the aggregated update (``federation.server_optimizer`` and its hyper-parameters)."""
    return ServerOptimizer(
        fed.server_optimizer,
        lr=fed.server_lr,
        momentum=fed.server_momentum,
        beta_2=fed.server_beta_2,
        tau=fed.server_tau,
    )


@dataclass
class ServerState:
    cfg: RunConfig
    task: Task
    model: SplitModel
    workload: Workload
    global_model: GlobalModel
    planner: RoundPlanner
    decoder: DecoderService
    evaluator: Evaluator
    # the host's FLOP rate the virtual clock sets the devices' speeds against (clock.host_flops, or measured: the
    # median of host_readings)
    host_flops: float = 0.0
    # what the host speed is measured on (None: clock.host_flops is given) and its readings so far
    probe: Probe | None = None
    host_readings: list[float] = field(default_factory=list)
    # the run's key for the CUs' own checkpoint of their optimizer moments (fl/cu/cu_checkpoint.py): set by the
    # server when it checkpoints and the moments are kept across rounds; "" = the CUs keep nothing on disk
    cu_state_key: str = ""

    @classmethod
    def build(cls, cfg: RunConfig) -> ServerState:
        """Everything in start-up order: the partition check, model, workload, planner, decoder service,
        aggregation, evaluation."""
        probe = Probe.build(cfg)
        task, model, hidden, workload = probe.task, probe.model, probe.hidden, probe.workload
        check_testbed(cfg)
        planner = build_planner(cfg, workload)
        # the decoder / head and the evaluation compute on runtime.server_device (collapipe_flwr/accelerator.py);
        # a head the CUs train (head_on_server: false) is only averaged here and stays on the CPU
        device = resolve_device(cfg.runtime.head_device, "runtime.server_device")
        if cfg.method.head_on_server:
            model.head.to(device)
        precision = resolve_precision(cfg.runtime.precision, device.type)
        decoder = start_decoder(cfg, model, int(hidden.shape[-1]), precision)
        eval_precision = resolve_precision(cfg.eval.resolved_precision(precision), device.type)  # eval.precision
        embedding_trained = wiring.embedding_travels(cfg)
        readings = [] if cfg.clock.host_flops else [probe.host_flops(cfg)]
        host_flops = cfg.clock.host_flops or readings[0]
        return cls(
            cfg,
            task,
            model,
            workload,
            GlobalModel(
                model,
                cfg.method,
                make_server_optimizer(cfg.federation),
                embedding_trained=embedding_trained,
                privacy=cfg.privacy,
                seed=cfg.seed,
                trainable_only=cfg.model.adapters_only,
            ),
            planner,
            decoder,
            Evaluator(task, cfg.eval, eval_precision, decoder, device),
            host_flops=host_flops,
            probe=None if cfg.clock.host_flops else probe,
            host_readings=readings,
        )

    def read_host_speed(self) -> float | None:
        """One more reading of the host's speed at a round's start (``clock.probe_every_round``), ``host_flops``
        the median of every reading so far; the reading, or None where none is taken (the speed is configured,
        the option is off, or the emulated testbed sets the devices' scales from its quotas)."""
        if self.probe is None or not self.cfg.clock.probe_every_round or self.cfg.testbed.enabled:
            return None
        reading = self.probe.host_flops(self.cfg)
        self.host_readings.append(reading)
        self.host_flops = statistics.median(self.host_readings)
        return reading

    def own_work_scale(self, role: str) -> float:
        """The virtual clock's seconds per host CPU second of the server's (``"server"``) or a CU's (``"cu"``) own
        work (``ClockSpec.own_work_scale``: host_flops / clock.<role>_flops); 1 on the emulated testbed, whose
        server and CUs are this host's processes, timed as they run."""
        return 1.0 if self.cfg.testbed.enabled else self.cfg.clock.own_work_scale(self.host_flops, role)

    @property
    def max_examples_per_round(self) -> int:
        """The most examples a CU can train on in one round (local_steps x b): bounds its FedAvg weight."""
        return self.cfg.federation.local_steps * wiring.batch_size(self.cfg)

    def instructions_for(self, t: int, plan: ClusterPlan, replan: Sub1Inputs | None = None) -> TrainInstructions:
        """What CU n needs for round t besides the weights: its plan, devices and the data-plane address; on the
        testbed what its devices and uplink are throttled to, and whether to measure its devices this round."""
        emulation = self.planner.emulation_for(t, plan, self.workload)
        clock = self.planner.clock_for(t, plan, self.workload, self.host_flops, replan, emulation)
        if clock is not None:  # the CU's own work against its speed (clock.cu_flops)
            clock = replace(clock, cu_scale=self.own_work_scale("cu"))
        return TrainInstructions(
            round=t,
            plan=plan,
            cluster_config=self.cfg.cluster_config(),
            devices=list(self.planner.devices_of(plan.cluster)),
            dataplane_address=self.decoder.address,
            dataplane_secret=self.decoder.key_for(t, plan.cluster),
            dataplane_root_certificate=self.decoder.root_certificate,
            replan=replan,
            measure=self.planner.measure_repeats(plan.cluster, t),
            emulation=emulation,
            report_profile=self.planner.uses_profiles,
            cu_state_key=self.cu_state_key,
            clock=clock,
        )

    def absorb_round(self, t: int, fold: RoundFold, losses: dict[int, float]) -> None:
        """Aggregate the round's replies, folded in as they arrived, and hand the CUs' losses to the queues."""
        self.global_model.absorb_round(t, fold)
        self.planner.observe(losses)

    def evaluate(self) -> dict[str, float]:
        return self.evaluator.evaluate(self.global_model.models_to_evaluate())

    def shutdown(self) -> None:
        self.decoder.stop()
