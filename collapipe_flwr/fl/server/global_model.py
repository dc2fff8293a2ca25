"""The global model the server owns between rounds: theta^emb and theta^enc (eqs. 6-9), and what aggregation does.

CU n downloads :meth:`GlobalModel.for_cluster` each round and returns its trained copy; :meth:`absorb`
folds the round's replies in with the server optimizer (``federation.server_optimizer``; FedAvg = the
example-weighted mean of eq. 9). The decoder / task head stays on the server and is never averaged,
except for methods that train it on the CU (``method.head_on_server: false``: it travels and is averaged
like the encoder). Without aggregation (``method.aggregate: false``, the ``pipeline`` baseline) each
cluster keeps its own embedding + encoder.
"""

from __future__ import annotations

import copy

import torch
from flwr.app import ArrayRecord

from collapipe_flwr.config import PrivacySpec
from collapipe_flwr.dssra.specs import MethodSpec
from collapipe_flwr.fl.messages import NUM_EXAMPLES, pack_weights
from collapipe_flwr.fl.server.central_dp import add_central_noise
from collapipe_flwr.fl.server.server_optimizer import ServerOptimizer
from collapipe_flwr.models.split import SplitModel

Parts = dict[str, dict[str, torch.Tensor]]
ClusterResult = tuple[int, Parts, dict]  # (cluster n, returned parts, reply metrics)


def flatten_parts(parts: Parts) -> dict[str, torch.Tensor]:
    return {f"{part}.{name}": value for part, sd in parts.items() for name, value in sd.items()}


def unflatten_parts(flat: dict[str, torch.Tensor]) -> Parts:
    parts: Parts = {}
    for name, value in flat.items():
        part, _, rest = name.partition(".")
        parts.setdefault(part, {})[rest] = value
    return parts


class GlobalModel:
    """The aggregated parts of ``model`` (embedding, encoder, and the head when the CU trains it)."""

    def __init__(
        self,
        model: SplitModel,
        method: MethodSpec,
        server_optimizer: ServerOptimizer,
        embedding_trained: bool = True,
        privacy: PrivacySpec | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.method = method
        self.server_optimizer = server_optimizer
        # federation.embedding: frozen -> CUs download the embedding but never return it (eq. 11: z_enc + theta_enc)
        self.embedding_trained = bool(embedding_trained)
        self.cluster_parts: dict[int, Parts] = {}  # method.aggregate = false: cluster n's own parts
        self.privacy = privacy or PrivacySpec()  # central DP: noise on each round's aggregate (central_dp.py)
        self.seed = int(seed)

    @property
    def travels_with_head(self) -> bool:
        """Whether the head is part of what CUs download and return (methods that train it on the CU)."""
        return not self.method.head_on_server

    def parts(self) -> Parts:
        """A detached copy of the global parts."""
        modules: list[tuple[str, torch.nn.Module]] = [
            ("embedding", self.model.embedding),
            ("encoder", self.model.blocks),
        ]
        if self.travels_with_head:
            modules.append(("head", self.model.head))
        return {part: {k: v.detach().clone() for k, v in mod.state_dict().items()} for part, mod in modules}

    def returned_parts(self) -> Parts:
        """The global parts a CU trains and sends back: :meth:`parts` without a frozen embedding."""
        parts = self.parts()
        if not self.embedding_trained:
            parts.pop("embedding")
        return parts

    def for_cluster(self, cluster: int) -> Parts:
        """What CU n downloads: the global parts, or without aggregation its own parts from its last round
        (over the global ones, for a part it does not return)."""
        if cluster in self.cluster_parts:
            return {**self.parts(), **copy.deepcopy(self.cluster_parts[cluster])}
        return self.parts()

    def expected_reply(self, cluster: int) -> Parts:
        """The parts (names, shapes, dtypes) CU n's reply must carry."""
        parts = self.for_cluster(cluster)
        if not self.embedding_trained:
            parts.pop("embedding")
        return parts

    def array_record(self) -> ArrayRecord:
        return pack_weights(self.parts())

    def absorb(self, t: int, results: list[ClusterResult]) -> None:
        """Aggregation of round t (eqs. 6-9) over the returned parts, weighted by each CU's num-examples."""
        if not self.method.aggregate:
            for cluster, parts, _ in results:
                self.cluster_parts[cluster] = parts
            return
        modules = {"embedding": self.model.embedding, "encoder": self.model.blocks, "head": self.model.head}
        current = flatten_parts(self.returned_parts())
        updates = [(flatten_parts(parts), float(metrics[NUM_EXAMPLES])) for _, parts, metrics in results]
        new = self.server_optimizer.step(t, current, updates)
        if self.privacy.mode == "central":
            new = add_central_noise(new, self.privacy, len(updates), self.seed, t)
        for part, state in unflatten_parts(new).items():
            modules[part].load_state_dict(state)

    def models_to_evaluate(self) -> list[SplitModel]:
        """The model itself, or without aggregation one copy per cluster with its own embedding + encoder
        and the server's head (their scores are averaged)."""
        if self.method.aggregate or not self.cluster_parts:
            return [self.model]
        models = []
        for cluster in sorted(self.cluster_parts):
            model = copy.copy(self.model)
            model.embedding = copy.deepcopy(self.model.embedding)
            model.blocks = copy.deepcopy(self.model.blocks)
            if "embedding" in self.cluster_parts[cluster]:  # absent when the embedding is frozen
                model.embedding.load_state_dict(self.cluster_parts[cluster]["embedding"])
            model.blocks.load_state_dict(self.cluster_parts[cluster]["encoder"])
            models.append(model)
        return models
