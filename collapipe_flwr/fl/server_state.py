"""What the edge server holds for a run: the global model, the decoder host, the scheduler, the network.

``ServerState`` is the strategy's model side (the strategy itself only speaks Flower):
- the global embedding + encoder (theta^emb, theta^enc) that CUs download each round and that FedAvg
  replaces (eqs. 6-9);
- the decoder / task head and its optimizer, served to the CUs over the data plane and trained on the
  server from every CU's activations (never averaged);
- the round's channel/device state (seeded sampler) and the scheduling policy that turns it into a plan
  X(t) (eq. 27), whose queues Y_n it updates after the round (eq. 29);
- the evaluator of the full model on the validation split.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord

from collapipe_flwr import wiring
from collapipe_flwr.config import RunConfig
from collapipe_flwr.dssra.plan import RoundPlan
from collapipe_flwr.fl.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.messages import pack_weights
from collapipe_flwr.precision import autocast, resolve_precision

PROBE_EXAMPLES = 8  # FLOPs and bytes are counted per sample, so a few real examples suffice


def sample_hidden(task, model, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A few real training examples through the embedding: the activations the workload is counted on."""
    n = min(PROBE_EXAMPLES, wiring.batch_size(cfg))
    batch = next(iter(task.batches(list(range(n)), n, seed=cfg.seed, shuffle=False)))
    with torch.no_grad():
        hidden = model.embedding(batch["input_ids"])
    return hidden, batch["attention_mask"]


def _flatten(parts: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{part}.{name}": value for part, sd in parts.items() for name, value in sd.items()}


def _unflatten(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, value in flat.items():
        part, _, rest = name.partition(".")
        parts.setdefault(part, {})[rest] = value
    return parts


def _decoder_schedule(cfg: RunConfig):
    """The decoder's lr factor for step ``seq`` (1, 2, ...) of round t: the same run-wide step clock as the CUs'."""
    factor = wiring.lr_schedule(cfg)
    return lambda round_, seq: factor(wiring.global_step(cfg, round_, max(0, int(seq) - 1)))


@dataclass
class ServerState:
    cfg: RunConfig
    task: object
    model: object
    head_optimizer: torch.optim.Optimizer
    spec: object
    sampler: object
    policy: object
    host: object | None
    dataplane_secret: str
    workload: object
    server_optimizer: ServerOptimizer | None = None
    plan: RoundPlan | None = None
    # method.aggregate = false (the `pipeline` baseline): each cluster keeps its own embedding + encoder
    cluster_parts: dict[int, dict] = field(default_factory=dict)

    @classmethod
    def build(cls, cfg: RunConfig) -> "ServerState":
        from collapipe_flwr.dssra.methods import make_planner
        from collapipe_flwr.dssra.specs import parse_method, parse_scheduler
        from collapipe_flwr.system.network import NetworkSpec
        from collapipe_flwr.system.state import StateSampler
        from collapipe_flwr.system.workload import measure_workload

        torch.manual_seed(cfg.seed)
        task = wiring.build_task(cfg)
        model = wiring.build_model(task, cfg)
        head_optimizer = wiring.optimizer_spec(cfg).build(model.head.parameters())
        spec = NetworkSpec.from_config(cfg.network, cfg.federation.num_clusters)
        hidden, mask = sample_hidden(task, model, cfg)
        workload = measure_workload(
            model.blocks, hidden, mask, batch_size=wiring.batch_size(cfg),
            steps_per_round=cfg.federation.local_steps, embedding=model.embedding, head=model.head,
        )
        method, scheduler = parse_method(dataclasses.asdict(cfg.method)), parse_scheduler(cfg.scheduler)
        policy = make_planner(method, scheduler, spec, workload, cfg.seed)
        secret = secrets.token_hex(16)
        host = None
        if cfg.method.head_on_server:
            from collapipe_flwr.fl.dataplane import DecoderHost

            host = DecoderHost(
                model.head,
                head_optimizer,
                secret=secret,
                bind=cfg.dataplane.bind,
                port=cfg.dataplane.port,
                fp16=cfg.dataplane.fp16,
                max_message_mb=cfg.dataplane.max_message_mb,
                hidden_size=int(hidden.shape[-1]),
                lr_schedule=_decoder_schedule(cfg),
                precision=resolve_precision(cfg.runtime.precision),
                joint=cfg.federation.decoder_update == "joint",
            )
            host.start()
        fed = cfg.federation
        server_optimizer = ServerOptimizer(fed.server_optimizer, lr=fed.server_lr, momentum=fed.server_momentum,
                                           beta_2=fed.server_beta_2, tau=fed.server_tau)
        return cls(cfg, task, model, head_optimizer, spec, StateSampler(spec, cfg.seed), policy, host, secret, workload,
                   server_optimizer)

    # ------------------------------------------------------------------ per round
    @property
    def policy_name(self) -> str:
        return str(self.cfg.scheduler.get("name", ""))

    @property
    def dataplane_address(self) -> str:
        if self.host is None:
            return ""
        return f"{self.cfg.dataplane.host}:{self.host.port}"

    @property
    def max_examples_per_round(self) -> int:
        """The most examples a CU can train on in one round (local_steps x b): bounds its FedAvg weight."""
        return self.cfg.federation.local_steps * wiring.batch_size(self.cfg)

    def plan_round(self, t: int) -> RoundPlan:
        state = self.sampler.sample(t)
        self.plan = self.policy.plan(t, state)
        return self.plan

    def devices_of(self, cluster: int):
        return self.spec.devices_of(cluster)

    def open_round(self, t: int, clusters: list[int]) -> None:
        if self.host is not None:
            self.host.open_round(t, clusters)

    def close_round(self) -> None:
        if self.host is not None:
            self.host.close_round()

    def _global_parts(self, with_head: bool) -> dict[str, dict[str, torch.Tensor]]:
        modules = [("embedding", self.model.embedding), ("encoder", self.model.blocks)]
        if with_head:
            modules.append(("head", self.model.head))
        return {part: {k: v.detach().clone() for k, v in mod.state_dict().items()} for part, mod in modules}

    def weights_for_cluster(self, cluster: int) -> dict[str, dict[str, torch.Tensor]]:
        """What CU n downloads: the global embedding + encoder (+ head when the CU trains it), or, without
        aggregation, the cluster's own embedding + encoder from its last round."""
        with_head = not self.cfg.method.head_on_server
        if cluster in self.cluster_parts:
            return copy.deepcopy(self.cluster_parts[cluster])
        return self._global_parts(with_head)

    def absorb_results(self, t: int, results: list[tuple[int, dict, dict]]) -> None:
        """Aggregation (eqs. 6-9): the server optimizer (``federation.server_optimizer``; FedAvg = the
        example-weighted mean) over the returned embeddings and encoders (and heads, for methods that train
        the head on the CU); without aggregation each cluster keeps its own."""
        if self.cfg.method.aggregate:
            modules = {"embedding": self.model.embedding, "encoder": self.model.blocks, "head": self.model.head}
            current = _flatten(self._global_parts(not self.cfg.method.head_on_server))
            updates = [(_flatten(parts), float(metrics["num-examples"])) for _, parts, metrics in results]
            new = _unflatten(self.server_optimizer.step(t, current, updates))
            for part, state in new.items():
                modules[part].load_state_dict(state)
        else:
            for cluster, parts, _ in results:
                self.cluster_parts[cluster] = parts
        losses = {cluster: float(metrics["train-loss"]) for cluster, _, metrics in results}
        if self.plan is not None:
            self.policy.observe(self.plan, losses)

    def global_array_record(self) -> ArrayRecord:
        return pack_weights(self._global_parts(not self.cfg.method.head_on_server))

    def aggregate_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """The global weights after the round (what save_client_weights stores as round<t>_global.pt)."""
        return self._global_parts(not self.cfg.method.head_on_server)

    def evaluate(self) -> dict[str, float]:
        """The full model on the validation split; without aggregation, the mean of the clusters' scores
        (each cluster's embedding + encoder with the server's head)."""
        if self.cfg.method.aggregate or not self.cluster_parts:
            return self._evaluate(self.model)
        scores = []
        for cluster in sorted(self.cluster_parts):
            model = copy.copy(self.model)
            model.embedding = copy.deepcopy(self.model.embedding)
            model.blocks = copy.deepcopy(self.model.blocks)
            model.embedding.load_state_dict(self.cluster_parts[cluster]["embedding"])
            model.blocks.load_state_dict(self.cluster_parts[cluster]["encoder"])
            scores.append(self._evaluate(model))
        return {k: sum(s[k] for s in scores) / len(scores) for k in scores[0]}

    def _evaluate(self, model) -> dict[str, float]:
        ev = self.cfg.eval
        parts = (model.embedding, model.blocks, model.head)
        for module in parts:
            module.eval()
        try:
            with torch.no_grad(), autocast(resolve_precision(self.cfg.runtime.precision)):
                return dict(self.task.evaluate(model, max_examples=ev.max_examples, batch_size=ev.batch_size, beam_size=ev.beam_size))
        finally:
            for module in parts:
                module.train()

    def shutdown(self) -> None:
        if self.host is not None:
            self.host.stop()
