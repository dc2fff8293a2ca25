"""The global model the server owns between rounds: theta^emb and theta^enc (eqs. 6-9), and what aggregation does.

CU n downloads :meth:`GlobalModel.for_cluster` each round and returns its trained copy; each reply is folded
into the round's :class:`RoundFold` as it arrives, and :meth:`GlobalModel.absorb_round` turns the fold into the
new global model with the server optimizer (``federation.server_optimizer``; FedAvg = the
example-weighted mean of eqs. 6-7). The decoder / task head stays on the server and is never averaged,
except for methods that train it on the CU (``method.head_on_server: false``: it travels and is averaged
like the encoder). Without aggregation (``method.aggregate: false``, the ``pipeline`` baseline) each
cluster keeps its own embedding + encoder.

``trainable_only`` (``model.lora.enabled``): replies carry, and aggregation averages, only the trainable tensors
(the LoRA adapters of every segment; models/trainable.py); a CU's first download carries the whole model, every
later one only those tensors, so the frozen base weights travel once per CU and never back.
"""

from __future__ import annotations

import copy

import torch
from flwr.app import ArrayRecord

from collapipe_flwr.config import PrivacyMode, PrivacySpec
from collapipe_flwr.dssra.specs import MethodSpec
from collapipe_flwr.fl.messages import pack_weights
from collapipe_flwr.fl.server.aggregation.central_dp import add_central_noise
from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.weighted_mean import WeightedSum
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.models.trainable import only_trainable

Parts = dict[str, dict[str, torch.Tensor]]


def flatten_parts(parts: Parts) -> dict[str, torch.Tensor]:
    return {f"{part}.{name}": value for part, sd in parts.items() for name, value in sd.items()}


def unflatten_parts(flat: dict[str, torch.Tensor]) -> Parts:
    parts: Parts = {}
    for name, value in flat.items():
        part, _, rest = name.partition(".")
        parts.setdefault(part, {})[rest] = value
    return parts


class RoundFold:
    """One round's CU replies, folded in one at a time as they arrive.

    With aggregation, a :class:`WeightedSum` of the returned parts (flat): sum_n w_n theta_n and W, the model's
    size whatever the number of CUs, each reply's tensors free to go once added. Without it (the ``pipeline``
    baseline) each cluster's own parts, which it downloads again next round.
    """

    def __init__(self, aggregate: bool) -> None:
        self.sum: WeightedSum[str] | None = WeightedSum() if aggregate else None
        self.own: dict[int, Parts] = {}

    @property
    def count(self) -> int:
        """n, the replies folded in."""
        return self.sum.count if self.sum is not None else len(self.own)

    def add(self, cluster: int, parts: Parts, weight: float) -> None:
        """Fold CU ``cluster``'s checked reply in with its FedAvg weight w_n (num-examples)."""
        if self.sum is None:
            self.own[cluster] = parts
        else:
            self.sum.add(flatten_parts(parts), weight)


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
        trainable_only: bool = False,
    ) -> None:
        self.model = model
        self.method = method
        self.server_optimizer = server_optimizer
        # federation.embedding: frozen -> CUs download the embedding but never return it (eq. 11: z_enc + theta_enc)
        self.embedding_trained = bool(embedding_trained)
        self.cluster_parts: dict[int, Parts] = {}  # method.aggregate = false: cluster n's own parts
        self.privacy = privacy or PrivacySpec()  # central DP: noise on each round's aggregate (central_dp.py)
        self.seed = int(seed)
        self.trainable_only = bool(trainable_only)
        self.has_base: set[int] = set()  # trainable_only: the CUs whose download carried the whole model once

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

    def _modules(self) -> dict[str, torch.nn.Module]:
        return {"embedding": self.model.embedding, "encoder": self.model.blocks, "head": self.model.head}

    def _trained(self, parts: Parts) -> Parts:
        """``parts`` without what CUs do not return: a frozen embedding, and under LoRA every frozen tensor."""
        if not self.embedding_trained:
            parts.pop("embedding", None)
        return only_trainable(parts, self._modules()) if self.trainable_only else parts

    def returned_parts(self) -> Parts:
        """The global parts a CU trains and sends back: :meth:`parts` without a frozen embedding (and, under LoRA,
        without the frozen base weights)."""
        return self._trained(self.parts())

    def for_cluster(self, cluster: int) -> Parts:
        """What CU n downloads: the global parts, or without aggregation its own parts from its last round
        (over the global ones, for a part or a tensor it does not return)."""
        parts = self.parts()
        for part, state in copy.deepcopy(self.cluster_parts.get(cluster, {})).items():
            parts[part] = {**parts.get(part, {}), **state}
        return parts

    def _download(self, cluster: int) -> Parts:
        """CU n's download: under LoRA the whole model once, then only the tensors that train."""
        if not self.trainable_only or cluster not in self.has_base:
            return self.for_cluster(cluster)
        return only_trainable(self.for_cluster(cluster), self._modules())

    def packed_for(self, clusters: list[int]) -> dict[int, ArrayRecord]:
        """What each CU in ``clusters`` downloads, packed: the CUs that download the global parts share one
        ArrayRecord (a CU only reads it), so a round's N train messages hold the model once, not N times."""
        shared: dict[bool, ArrayRecord] = {}
        out = {}
        for cluster in clusters:
            if cluster in self.cluster_parts:
                out[cluster] = pack_weights(self._download(cluster))
            else:
                whole = not self.trainable_only or cluster not in self.has_base
                if whole not in shared:
                    shared[whole] = pack_weights(self._download(cluster))
                out[cluster] = shared[whole]
            self.has_base.add(cluster)
        return out

    def expected_reply(self, cluster: int) -> Parts:
        """The parts (names, shapes, dtypes) CU n's reply must carry."""
        return self._trained(self.for_cluster(cluster))

    def array_record(self) -> ArrayRecord:
        return pack_weights(self.parts())

    def new_round(self) -> RoundFold:
        """An empty fold for this round's replies (:meth:`absorb_round` turns it into the new global model)."""
        return RoundFold(self.method.aggregate)

    def absorb_round(self, t: int, fold: RoundFold) -> None:
        """Aggregation of round t (eqs. 6-7) from the replies folded in as they arrived: the server optimizer on
        their example-weighted mean, then central DP's noise (sigma = z C / n, n = the replies folded in)."""
        if fold.sum is None:
            self.cluster_parts.update(fold.own)
            return
        if not fold.count:
            return
        modules = self._modules()
        current = flatten_parts(self.returned_parts())
        new = self.server_optimizer.apply(t, current, fold.sum)
        if self.privacy.mode is PrivacyMode.CENTRAL:
            new = add_central_noise(new, self.privacy, fold.count, self.seed, t)
        for part, state in unflatten_parts(new).items():  # under LoRA the trainable tensors only
            modules[part].load_state_dict(state, strict=not self.trainable_only)

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
            strict = not self.trainable_only  # under LoRA a cluster's own tensors are its adapters only
            if "embedding" in self.cluster_parts[cluster]:  # absent when the embedding is frozen
                model.embedding.load_state_dict(self.cluster_parts[cluster]["embedding"], strict=strict)
            model.blocks.load_state_dict(self.cluster_parts[cluster]["encoder"], strict=strict)
            models.append(model)
        return models
