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

import secrets
from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord

from collapipe_flwr import wiring
from collapipe_flwr.config import RunConfig
from collapipe_flwr.dssra.plan import RoundPlan
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.aggregation import weighted_average
from collapipe_flwr.fl.messages import pack_weights

# Methods whose training path this module implements; the others arrive with the baselines.
TRAINABLE_METHODS = ("collapipe", "collapipe_no_ss")


def scheduler_for_method(cfg: RunConfig) -> dict:
    """The scheduler section, with segment scheduling switched off for ``collapipe_no_ss`` (uniform
    blocks over all K devices and a fixed m)."""
    scheduler = dict(cfg.scheduler)
    if not cfg.method.segment_scheduling:
        scheduler["segment_scheduling"] = False
        scheduler["fixed_m"] = cfg.method.fixed_m
    return scheduler


PROBE_EXAMPLES = 8  # FLOPs and bytes are counted per sample, so a few real examples suffice


def sample_hidden(task, model, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A few real training examples through the embedding: the activations the workload is counted on."""
    n = min(PROBE_EXAMPLES, wiring.batch_size(cfg))
    batch = next(iter(task.batches(list(range(n)), n, seed=cfg.seed, shuffle=False)))
    with torch.no_grad():
        hidden = model.embedding(batch["input_ids"])
    return hidden, batch["attention_mask"]


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
    plan: RoundPlan | None = None
    examples_seen: dict = field(default_factory=dict)

    @classmethod
    def build(cls, cfg: RunConfig) -> "ServerState":
        from collapipe_flwr.dssra.policies import make_policy
        from collapipe_flwr.system.network import NetworkSpec
        from collapipe_flwr.system.state import StateSampler
        from collapipe_flwr.system.workload import measure_workload

        if cfg.method.name not in TRAINABLE_METHODS:
            raise ConfigError(
                f"method={cfg.method.name} has no training path in this version; use one of {', '.join(TRAINABLE_METHODS)}"
            )
        torch.manual_seed(cfg.seed)
        task = wiring.build_task(cfg)
        model = wiring.build_model(task, cfg)
        head_optimizer = wiring.optimizer_spec(cfg).build(model.head.parameters())
        spec = NetworkSpec.from_config(cfg.network, cfg.federation.num_clusters)
        hidden, mask = sample_hidden(task, model, cfg)
        workload = measure_workload(
            model.blocks, hidden, mask, batch_size=wiring.batch_size(cfg),
            steps_per_round=cfg.federation.local_steps, embedding=model.embedding,
        )
        policy = make_policy(scheduler_for_method(cfg), spec, workload, cfg.seed)
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
            )
            host.start()
        return cls(cfg, task, model, head_optimizer, spec, StateSampler(spec, cfg.seed), policy, host, secret, workload)

    # ------------------------------------------------------------------ per round
    @property
    def policy_name(self) -> str:
        return str(self.cfg.scheduler.get("name", ""))

    @property
    def dataplane_address(self) -> str:
        if self.host is None:
            return ""
        return f"{self.cfg.dataplane.host}:{self.host.port}"

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

    def weights_for_cluster(self, cluster: int) -> dict[str, dict[str, torch.Tensor]]:
        return {
            "embedding": {k: v.detach().clone() for k, v in self.model.embedding.state_dict().items()},
            "encoder": {k: v.detach().clone() for k, v in self.model.blocks.state_dict().items()},
        }

    def absorb_results(self, t: int, results: list[tuple[int, dict, dict]]) -> None:
        """FedAvg (eqs. 6-9): example-weighted mean of the returned embeddings and encoders."""
        weights = [float(metrics["num-examples"]) for _, _, metrics in results]
        for part, module in (("embedding", self.model.embedding), ("encoder", self.model.blocks)):
            averaged = weighted_average([parts[part] for _, parts, _ in results], weights)
            module.load_state_dict(averaged)
        losses = {cluster: float(metrics["train-loss"]) for cluster, _, metrics in results}
        if self.plan is not None:
            self.policy.observe(self.plan, losses)

    def global_array_record(self) -> ArrayRecord:
        return pack_weights(self.weights_for_cluster(-1))

    def evaluate(self) -> dict[str, float]:
        ev = self.cfg.eval
        self.model.embedding.eval()
        self.model.blocks.eval()
        self.model.head.eval()
        try:
            with torch.no_grad():
                return dict(self.task.evaluate(self.model, max_examples=ev.max_examples, batch_size=ev.batch_size, beam_size=ev.beam_size))
        finally:
            self.model.embedding.train()
            self.model.blocks.train()
            self.model.head.train()

    def shutdown(self) -> None:
        if self.host is not None:
            self.host.stop()
