"""A checkpoint's values held to what this run can hold, before any of it is used.

After the archive's own bounds (collapipe_flwr/torch_archive.py, on a payload whose tensors are mapped from
the file), :func:`check_round` and :func:`check_tensors` need no model: ``round`` a non-negative int (not -3,
1.5 or True), tensors only in the parts that hold them (:data:`TENSOR_PARTS`), each dense and within its
storage and the file. The launcher's pre-check (``collapipe run ... resume=true``) stops there;
the ServerApp's own resume (the ``flwr run`` deployment path too) then calls :func:`check_fits`, which holds every
tensor to the shape of what it restores in this run's server, so no size the file claims is allocated unless
this run's model has it too:

- ``model.<part>.<name>``: the model's state dicts (embedding, encoder, head), every name and shape;
- ``cluster_parts.<n>.<part>.<name>``: cluster n (< the run's clusters) own parts, names and shapes of the same;
- ``decoder_optimizer.state.<i>.<moment>``: parameter i of the head's optimizer, its shape (or one number, as
  Adam's ``step``);
- ``server_optimizer``: its ``layout`` this model's floating parameters (names, shapes), its moments (FedAvgM's
  list, FedOpt's dicts) those shapes;
- ``rng.torch`` and ``rng.numpy.keys``: this process's random states' sizes.
Any tensor elsewhere is refused. Each refusal is one :class:`ConfigError` line naming the file and the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.aggregation.global_model import flatten_parts
from collapipe_flwr.fl.server.server_state import ServerState
from collapipe_flwr.torch_archive import refused, unbounded, walk_tensors

MAX_ROUND = 2**31 - 1
TENSOR_PARTS = ("model", "cluster_parts", "server_optimizer", "decoder_optimizer", "rng")
STRATEGY_MOMENTS = ("momentum_vector", "m_t", "v_t")  # checkpoint.STRATEGY_STATE
NUMPY_KEYS = (624,)  # MT19937's state words (np.random.get_state)
Shapes = dict[str, tuple[int, ...]]


def check_round(payload: Mapping[str, Any], path: Path) -> int:
    """The checkpoint's round: a non-negative int (not a bool, a float or a string)."""
    value = payload.get("round")
    if type(value) is not int or not 0 <= value <= MAX_ROUND:
        raise refused(path, f"its round {value!r} is not a round number (a non-negative integer)"[:200])
    return value


def check_tensors(payload: Mapping[str, Any], path: Path) -> None:
    """Every tensor of a (memory-mapped) payload dense and holding no more elements than its storage, its
    storage no larger than the file; tensors only under :data:`TENSOR_PARTS`; nesting at most MAX_DEPTH."""
    size = path.stat().st_size
    for where, tensor in walk_tensors(payload, path):
        if where.split(".")[0] not in TENSOR_PARTS:
            raise refused(path, f"it holds a tensor at {where}, where none belongs")
        reason = unbounded(tensor, size)
        if reason is not None:
            raise refused(path, f"its tensor {where} {reason}")


def misfit(path: Path, reason: str) -> ConfigError:
    return ConfigError(
        f"{path} does not fit this run: {reason}; resume with the run's own settings, or start the run afresh"
    )


def check_fits(server: ServerState, payload: Mapping[str, Any], path: Path) -> None:
    """Every tensor of ``payload`` of the shape of what it restores in ``server`` (the module docstring);
    a one-line ConfigError naming the first that is not, or that has no place in this run's state."""
    modules = {"embedding": server.model.embedding, "encoder": server.model.blocks, "head": server.model.head}
    shapes = {part: {k: tuple(v.shape) for k, v in m.state_dict().items()} for part, m in modules.items()}
    checked: set[int] = set()
    checked |= _check_parts(path, "model", payload.get("model"), shapes, whole=True)
    clusters = payload.get("cluster_parts")
    for cluster, parts in _mapping(path, "cluster_parts", clusters).items():
        if type(cluster) is not int or not 0 <= cluster < server.cfg.federation.num_clusters:
            raise misfit(path, f"it holds cluster_parts of cluster {str(cluster)[:40]!r}, not one of this run's")
        checked |= _check_parts(path, f"cluster_parts.{cluster}", parts, shapes, whole=False)
    checked |= _check_decoder(path, payload.get("decoder_optimizer"), server)
    checked |= _check_server_optimizer(path, payload.get("server_optimizer"), _layout(server))
    checked |= _check_rng(path, payload.get("rng"))
    for where, tensor in walk_tensors(payload, path):
        if id(tensor) not in checked:
            raise misfit(path, f"its tensor {where} has no place in this run's state")


def _mapping(path: Path, where: str, value: Any) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise misfit(path, f"its {where} is a {type(value).__name__}, not a mapping")
    return value


def _tensor(path: Path, where: str, value: Any, shape: tuple[int, ...], scalar_ok: bool = False) -> int:
    """``id(value)`` once it is a tensor of ``shape`` (or of one element, with ``scalar_ok``)."""
    if not isinstance(value, torch.Tensor):
        raise misfit(path, f"its {where} is a {type(value).__name__}, not a tensor")
    if tuple(value.shape) != shape and not (scalar_ok and value.numel() <= 1):
        raise misfit(path, f"its tensor {where} has shape {tuple(value.shape)}, this run's has {shape}")
    return id(value)


def _check_parts(path: Path, where: str, parts: Any, shapes: dict[str, Shapes], whole: bool) -> set[int]:
    """The model's parts (``whole``: every part and name) or a cluster's own ones (a subset)."""
    checked = set()
    given = _mapping(path, where, parts)
    for part, state in given.items():
        if part not in shapes:
            raise misfit(path, f"it holds {where}.{str(part)[:40]}, a part this run's model does not have")
        for name, tensor in _mapping(path, f"{where}.{part}", state).items():
            if name not in shapes[part]:
                raise misfit(path, f"it holds {where}.{part}.{str(name)[:80]}, which this run's model does not have")
            checked.add(_tensor(path, f"{where}.{part}.{name}", tensor, shapes[part][name]))
        missing = sorted(set(shapes[part]) - set(state)) if whole else []
        if missing:
            raise misfit(path, f"it lacks {where}.{part}.{missing[0]}, which this run's model has")
    absent = sorted(set(shapes) - set(given)) if whole else []
    if absent:
        raise misfit(path, f"it lacks {where}.{absent[0]}, a part of this run's model")
    return checked


def _check_decoder(path: Path, state: Any, server: ServerState) -> set[int]:
    """The decoder optimizer's moments: per parameter index, the shape of that head parameter."""
    host = server.decoder.host
    if state is None or host is None or host.optimizer is None:
        return set()  # not restored (checkpoint.restore): nothing of it is used
    params = [p for group in host.optimizer.param_groups for p in group["params"]]
    checked = set()
    moments_of = _mapping(path, "decoder_optimizer", state).get("state")
    for index, moments in _mapping(path, "decoder_optimizer.state", moments_of).items():
        if type(index) is not int or not 0 <= index < len(params):
            raise misfit(
                path, f"it holds decoder_optimizer.state.{str(index)[:40]}, of no parameter of this run's head"
            )
        shape = tuple(params[index].shape)
        for name, tensor in _mapping(path, f"decoder_optimizer.state.{index}", moments).items():
            checked.add(_tensor(path, f"decoder_optimizer.state.{index}.{name}", tensor, shape, scalar_ok=True))
    return checked


def _layout(server: ServerState) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The layout the server optimizer gives this model (ServerOptimizer.apply: its floating parameters)."""
    flat = flatten_parts(server.global_model.returned_parts())
    return tuple((k, tuple(flat[k].shape)) for k in sorted(flat) if torch.is_floating_point(flat[k]))


def _check_server_optimizer(path: Path, state: Any, layout: tuple[tuple[str, tuple[int, ...]], ...]) -> set[int]:
    """The server optimizer's moments: its saved layout must be this model's, each moment of its shape."""
    state = _mapping(path, "server_optimizer", state)
    saved = state.get("layout")
    if saved is not None:
        try:
            saved = tuple((str(k), tuple(int(n) for n in s)) for k, s in saved)
        except (TypeError, ValueError):
            raise misfit(path, "its server_optimizer.layout is not a list of (name, shape)") from None
        if saved != layout:
            raise misfit(path, "its server_optimizer.layout is not this run's model's floating parameters")
    shapes = dict(saved or ())
    order = [shape for _, shape in saved or ()]
    checked = set()
    for attr in STRATEGY_MOMENTS:
        value = state.get(attr)
        is_list = isinstance(value, (list, tuple))
        items = list(enumerate(value)) if is_list else list(_mapping(path, f"server_optimizer.{attr}", value).items())
        for key, tensor in items:
            where = f"server_optimizer.{attr}.{str(key)[:80]}"
            shape = order[key] if isinstance(key, int) and key < len(order) else shapes.get(str(key))
            if shape is None:
                raise misfit(path, f"its tensor {where} belongs to no parameter of the server optimizer's layout")
            checked.add(_tensor(path, where, tensor, shape))
    return checked


def _check_rng(path: Path, rng: Any) -> set[int]:
    """The random states: torch's of this process's size, NumPy's MT19937 words."""
    rng = _mapping(path, "rng", rng)
    checked = set()
    if "torch" in rng:
        checked.add(_tensor(path, "rng.torch", rng["torch"], tuple(torch.get_rng_state().shape)))
    numpy_state = _mapping(path, "rng.numpy", rng.get("numpy"))
    if "keys" in numpy_state:
        checked.add(_tensor(path, "rng.numpy.keys", numpy_state["keys"], NUMPY_KEYS))
    return checked
