"""Server-side optimizer over the aggregated update (FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad).

The update formulas are not rewritten here: :class:`ServerOptimizer` drives one of Flower's own message-based
strategies (``flwr.serverapp.strategy``) through exactly the calls Flower's ``Strategy.start`` loop makes:

1. the strategy's notion of the current global arrays is set the way its ``configure_train`` sets it
   (FedAvgM: ``current_arrays`` is an ``ArrayRecord``; FedAdam/FedYogi/FedAdagrad (``FedOpt``):
   ``current_arrays`` is a ``dict`` of NumPy arrays; FedAvg keeps none). ``configure_train`` itself is not
   called, since it samples nodes from a Grid (global ``random`` state, waiting for nodes);
2. one train instruction ``Message`` (ArrayRecord under ``strategy.arrayrecord_key``, ConfigRecord with
   ``server-round`` under ``strategy.configrecord_key``) and one reply ``Message(content, reply_to=...)``
   carrying the clients' example-weighted mean (a
   :class:`~collapipe_flwr.fl.weighted_mean.WeightedSum`
   the server folded every CU's reply into as it arrived) and a MetricRecord with their total weight W under
   ``strategy.weighted_by_key``: Flower's FedAvg of that one reply is the mean itself (w / W = 1), and every
   strategy here uses only that mean (FedAvgM/FedOpt: the pseudo-gradient between it and the global arrays);
3. ``strategy.aggregate_train(server_round, [reply])``, whose ArrayRecord is converted back to torch.

The strategy instance lives as long as the :class:`ServerOptimizer`, so its moments (FedAvgM's
``momentum_vector``, FedOpt's ``m_t``/``v_t``) persist over rounds. ``current`` is given every round and becomes
the strategy's current arrays (in normal use it is the previous round's output, which is what FedAvgM would
have kept itself).

Dtypes: floating tensors are handed to Flower as float32 (float16/bfloat16/float32) or float64 (float64), so the
moments are kept in at least float32; the result is cast back to the dtype of ``current``.

Non-floating tensors (integer/bool buffers such as ``num_batches_tracked`` or position ids) are never
optimised: if every client returns the same value it is used as is, otherwise the example-weighted mean of the
clients' values is rounded to the nearest integer and cast to the buffer's dtype (FedAvg's result).

Flower (Reddi et al. 2021, Hsu et al. 2019 conventions, see the strategies' source), with x the global
arrays, a the weighted mean of the clients' arrays and t the server round (Flower counts from 1):

* fedavgm: g = x - a; m = g (first round) else momentum * m + g; x <- x - lr * m
* fedadam: d = a - x; m = b1 m + (1 - b1) d; v = b2 v + (1 - b2) d^2;
  x <- x + lr * sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) * m / (sqrt(v) + tau)
* fedyogi: v = v - (1 - b2) d^2 sign(v - d^2); x <- x + lr * m / (sqrt(v) + tau)
* fedadagrad: m = d; v = v + d^2; x <- x + lr * m / (sqrt(v) + tau)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.app.constants import DEFAULT_TTL
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi

from collapipe_flwr.config.server_optimizer_rules import SERVER_OPTIMIZERS, ServerOptimizerName, check_server_optimizer
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.weighted_mean import WeightedSum, sum_dtype

__all__ = ["SERVER_OPTIMIZERS", "ServerOptimizer"]

_METRICS_KEY = "metrics"  # name of the MetricRecord in the synthetic replies
_SERVER_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID


# federation.server_optimizer -> Flower's strategy, from (lr, momentum, beta_2, tau)
STRATEGIES: dict[ServerOptimizerName, Callable[[float, float, float, float], FedAvg]] = {
    ServerOptimizerName.FEDAVG: lambda lr, momentum, beta_2, tau: FedAvg(),
    ServerOptimizerName.FEDAVGM: lambda lr, momentum, beta_2, tau: FedAvgM(
        server_learning_rate=lr, server_momentum=momentum
    ),
    ServerOptimizerName.FEDADAM: lambda lr, momentum, beta_2, tau: FedAdam(
        eta=lr, beta_1=momentum, beta_2=beta_2, tau=tau
    ),
    ServerOptimizerName.FEDYOGI: lambda lr, momentum, beta_2, tau: FedYogi(
        eta=lr, beta_1=momentum, beta_2=beta_2, tau=tau
    ),
    ServerOptimizerName.FEDADAGRAD: lambda lr, momentum, beta_2, tau: FedAdagrad(eta=lr, tau=tau),
}


def _to_arrayrecord(state: Mapping[str, torch.Tensor], keys: Sequence[str], dtypes: Mapping[str, torch.dtype]):
    """ArrayRecord of ``state[k]`` for ``k`` in ``keys`` (in that order), each as ``dtypes[k]`` on the CPU."""
    return ArrayRecord({k: Array(state[k].detach().to("cpu", dtype=dtypes[k]).numpy()) for k in keys})


def _to_torch(array: Array, dtype: torch.dtype) -> torch.Tensor:
    values = array.numpy()
    if not values.flags.writeable:
        values = values.copy()
    return torch.from_numpy(values).to(dtype)


def _check_round(server_round: object) -> None:
    """t: an int >= 1 (Flower counts rounds from 1)."""
    if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
        raise CollaPipeError(f"server_round={server_round!r} must be an int >= 1 (Flower counts rounds from 1)")


def _checked_current(current: object) -> Mapping[str, torch.Tensor]:
    """The global flat state dict: non-empty, real torch tensors only."""
    if not isinstance(current, Mapping) or not current:
        raise CollaPipeError("the current global state dict is empty or not a dict; pass the flat state dict")
    for key, tensor in current.items():
        if not isinstance(tensor, torch.Tensor):
            raise CollaPipeError(f"current[{key!r}] is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.is_complex():
            raise CollaPipeError(f"current[{key!r}] is complex ({tensor.dtype}); only real tensors are supported")
    return current


def _checked_result(i: int, result: object, current: Mapping[str, torch.Tensor]) -> float:
    """Client ``i``'s (state_dict, num_examples) pair: the global model's names and shapes; returns its weight."""
    if not isinstance(result, (tuple, list)) or len(result) != 2 or not isinstance(result[0], Mapping):
        raise CollaPipeError(f"result {i} is not a (state_dict, num_examples) pair")
    state, weight = result
    if set(state) != set(current):
        missing, extra = sorted(set(current) - set(state)), sorted(set(state) - set(current))
        raise CollaPipeError(
            f"result {i} has different parameter names than the global model (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); clients must return the full flat state dict of the same model"
        )
    for key, ref in current.items():
        _check_client_tensor(i, key, state[key], ref)
    return _checked_weight(i, weight)


def _check_client_tensor(i: int, key: str, tensor: object, ref: torch.Tensor) -> None:
    """Client ``i``'s ``key``: a real torch tensor of the global model's shape."""
    if not isinstance(tensor, torch.Tensor):
        raise CollaPipeError(f"result {i}: {key!r} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.shape != ref.shape:
        raise CollaPipeError(
            f"result {i}: parameter {key!r} has shape {tuple(tensor.shape)} but the global model's is "
            f"{tuple(ref.shape)}; clients must train the same architecture"
        )
    if tensor.is_complex():
        raise CollaPipeError(f"result {i}: {key!r} is complex ({tensor.dtype}); real tensors only")


def _checked_weight(i: int, weight: object) -> float:
    """Client ``i``'s weight (num-examples) as a float: a finite number >= 0."""
    not_a_number = f"result {i} has weight {weight!r}, not a number; pass its num-examples"
    if isinstance(weight, (bool, str, bytes)):
        raise CollaPipeError(not_a_number)
    try:
        value = float(weight)  # type: ignore[arg-type]  # anything float() takes, e.g. a NumPy scalar
    except (TypeError, ValueError):
        raise CollaPipeError(not_a_number) from None
    if not math.isfinite(value) or value < 0:
        raise CollaPipeError(f"result {i} has weight {weight!r}; a weight (num-examples) must be finite, >= 0")
    return value


class ServerOptimizer:
    """Turn the clients' state dicts into the next global state dict with one of Flower's strategies.

    ``name`` is one of :data:`SERVER_OPTIMIZERS`. ``lr`` is FedAvgM's ``server_learning_rate`` and the FedOpt
    strategies' ``eta``; ``momentum`` is FedAvgM's ``server_momentum`` and FedAdam/FedYogi's ``beta_1``;
    ``beta_2`` and ``tau`` go to FedAdam/FedYogi (``tau`` also to FedAdagrad). FedAvg uses none of them.
    The name and the values it uses are checked by the rules ``federation.server_*`` is checked by
    (``config/server_optimizer_rules.py``).
    """

    def __init__(
        self, name: str = "fedavg", lr: float = 1.0, momentum: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3
    ) -> None:
        self.name = check_server_optimizer(
            name,
            {"lr": lr, "momentum": momentum, "beta_2": beta_2, "tau": tau},
            name_key="server optimizer name",
            key_of=lambda hyper: f"server optimizer {hyper}",
            used_only=True,  # FedAvg uses none of them, FedAdagrad no momentum or beta_2
        )
        self.lr, self.momentum, self.beta_2, self.tau = lr, momentum, beta_2, tau
        self.strategy: FedAvg = STRATEGIES[self.name](float(lr), float(momentum), float(beta_2), float(tau))
        # names and shapes of the floating parameters the strategy's moments belong to (set by the first step)
        self._layout: tuple[tuple[str, tuple[int, ...]], ...] | None = None

    def __repr__(self) -> str:
        hyper = f"lr={self.lr}, momentum={self.momentum}, beta_2={self.beta_2}, tau={self.tau}"
        return f"ServerOptimizer({str(self.name)!r}, {hyper})"

    # ------------------------------------------------------------------ validation

    def _validate(self, server_round: object, current: object, results: object) -> None:
        """Check every input of :meth:`step` before anything changes."""
        _check_round(server_round)
        global_state = _checked_current(current)
        if not isinstance(results, Sequence) or not results:
            raise CollaPipeError("no client results to aggregate; check that at least one CU finished the round")
        weights = [_checked_result(i, result, global_state) for i, result in enumerate(results)]
        if not sum(weights) > 0:
            raise CollaPipeError("aggregation weights (num-examples) sum to zero; every CU reported 0 examples")

    def _validate_folded(
        self, server_round: object, current: object, folded: WeightedSum[str]
    ) -> tuple[list[str], list[str]]:
        """Check :meth:`apply`'s inputs before anything changes; return (floating keys, other keys)."""
        _check_round(server_round)
        global_state = _checked_current(current)
        if not folded.count:
            raise CollaPipeError("no client results to aggregate; check that at least one CU finished the round")
        if set(folded.keys()) != set(global_state):
            raise CollaPipeError("the folded states have different parameter names than the global model")
        for key, ref in global_state.items():
            if folded.shape(key) != tuple(ref.shape):
                raise CollaPipeError(
                    f"the folded {key!r} has shape {folded.shape(key)} but the global model's is {tuple(ref.shape)}"
                )
        if not folded.total > 0:
            raise CollaPipeError("aggregation weights (num-examples) sum to zero; every CU reported 0 examples")
        # sorted: the strategy sees the same order every round whatever the dict order (FedAvgM zips by position)
        float_keys = sorted(k for k, t in global_state.items() if torch.is_floating_point(t))
        other_keys = [k for k, t in global_state.items() if not torch.is_floating_point(t)]
        self._check_layout(global_state, float_keys)
        return float_keys, other_keys

    def _check_layout(self, current: Mapping[str, torch.Tensor], float_keys: list[str]) -> None:
        """The floating parameters (names, shapes) must be the first round's: the moments belong to them."""
        if self.name is not ServerOptimizerName.FEDAVG and self._layout is not None:
            layout = tuple((k, tuple(current[k].shape)) for k in float_keys)
            if layout != self._layout:
                raise CollaPipeError(
                    "the global model's floating parameters (names/shapes) changed since the first round; the "
                    f"{self.name} moments belong to the old model, so create a new ServerOptimizer for the new one"
                )

    # ------------------------------------------------------------------ Flower

    def _set_current_arrays(self, arrays: ArrayRecord) -> None:
        """Give the strategy the global arrays of this round, as its ``configure_train`` would."""
        strategy = self.strategy
        if isinstance(strategy, FedAvgM):
            strategy.current_arrays = arrays  # FedAvgM.configure_train: an ArrayRecord
        elif hasattr(strategy, "current_arrays"):  # FedOpt.configure_train: a dict of NumPy arrays
            strategy.current_arrays = {k: array.numpy() for k, array in arrays.items()}

    def _flower_step(
        self, server_round: int, current: Mapping[str, torch.Tensor], folded: WeightedSum[str], keys: list[str]
    ) -> dict[str, torch.Tensor]:
        """Flower's strategy on one reply: the clients' weighted mean with weight W (its FedAvg of one reply is
        that mean exactly, w / W = 1), so FedAvgM/FedOpt apply their update to the mean of every client."""
        strategy = self.strategy
        dtypes = {k: sum_dtype(current[k].dtype) for k in keys}
        global_arrays = _to_arrayrecord(current, keys, dtypes)
        self._set_current_arrays(global_arrays)
        instruction = RecordDict(
            {
                strategy.arrayrecord_key: global_arrays,
                strategy.configrecord_key: ConfigRecord({"server-round": server_round}),
            }
        )
        # built with explicit metadata: Message(content, dst_node_id, ...) needs the run's TaskIdentity,
        # which only exists inside a ServerApp process
        metadata = Metadata(
            run_id=0,
            message_id="",
            src_node_id=_SERVER_NODE_ID,
            dst_node_id=_SERVER_NODE_ID + 1,
            reply_to_message_id="",
            group_id=str(server_round),
            created_at=time.time(),
            ttl=float(DEFAULT_TTL),
            message_type=MessageType.TRAIN,
        )
        train_msg = Message(instruction, metadata=metadata)  # type: ignore[call-overload]  # flwr: internal kwarg
        mean = ArrayRecord({k: Array(folded.mean(k).to(dtype=dtypes[k]).numpy()) for k in keys})
        content = RecordDict(
            {
                strategy.arrayrecord_key: mean,
                _METRICS_KEY: MetricRecord({strategy.weighted_by_key: float(folded.total)}),
            }
        )
        arrays, _ = strategy.aggregate_train(server_round, [Message(content, reply_to=train_msg)])
        if arrays is None or set(arrays.keys()) != set(keys):
            raise CollaPipeError(f"Flower's {type(strategy).__name__}.aggregate_train returned no arrays (a bug)")
        return {k: _to_torch(arrays[k], current[k].dtype) for k in keys}

    # ------------------------------------------------------------------ public

    def step(
        self,
        server_round: int,
        current: dict[str, torch.Tensor],
        results: list[tuple[dict[str, torch.Tensor], float]],
    ) -> dict[str, torch.Tensor]:
        """The new global flat state dict (names, order and dtypes of ``current``; CPU tensors).

        ``results`` holds each client's flat state dict and its weight (num-examples); they are checked, folded
        into a :class:`WeightedSum` and handed to :meth:`apply`. Inputs are not modified.
        """
        self._validate(server_round, current, results)
        folded: WeightedSum[str] = WeightedSum()
        for state, weight in results:
            folded.add({k: state[k] for k in current}, float(weight))
        return self.apply(server_round, current, folded)

    def apply(
        self, server_round: int, current: dict[str, torch.Tensor], folded: WeightedSum[str]
    ) -> dict[str, torch.Tensor]:
        """The new global flat state dict from the round's running sum (the clients' states folded in one at
        a time, :class:`WeightedSum`): Flower's strategy on the weighted mean for the floating tensors, the
        mean itself (rounded, or the common value) for the integer/bool buffers."""
        float_keys, other_keys = self._validate_folded(server_round, current, folded)
        out: dict[str, torch.Tensor] = {}
        if float_keys:
            out.update(self._flower_step(server_round, current, folded, float_keys))
            self._layout = tuple((k, tuple(current[k].shape)) for k in float_keys)
        for key in other_keys:
            out[key] = folded.mean(key).to(dtype=current[key].dtype, copy=True)
        return {k: out[k] for k in current}
