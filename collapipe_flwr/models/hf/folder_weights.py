"""The weights of a pretrained model folder checked against its config.json before any run starts.

transformers' ``from_pretrained`` fills every tensor a folder lacks with random values and says so only in a
load report (which the run's quiet mode hides), and fails on a wrong-shaped tensor only once the model is
built, in the ServerApp. Here the tensors the folder's architecture needs (the model built from config.json on
the meta device: no memory, no weights read) are compared with those its safetensors headers list
(models/safetensors_header.py: safetensors' own header checks): a missing tensor is refused unless the run allows
missing weights (``model.allow_missing_weights``), a wrong-shaped one always, each in one line naming the first.

Names are compared as transformers matches them: without the base model's prefix (``transformer.`` /
``model.`` / ``bert.``), legacy LayerNorm ``gamma`` / ``beta`` as ``weight`` / ``bias``; a tied LM head needs no
tensor of its own, and an encoder's pooler is fresh (tasks/hf_encoder.py). A folder of ``pytorch_model.bin``
files (a pickle, not read here) is checked after loading instead (:func:`check_loading_info`).
"""

from __future__ import annotations

import json
from pathlib import Path

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.safetensors_header import tensor_shapes

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 2**20
FRESH = ("pooler.",)  # an encoder's pooler: the task heads start it fresh
ALLOW_KEY = "model.allow_missing_weights"


def _shards(folder: Path) -> list[Path]:
    """The safetensors shards an index file names (plain file names in the folder; the index's size bounded)."""
    index = folder / INDEX
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise ConfigError(f"{index} is over {MAX_INDEX_BYTES} bytes; the file is damaged, copy it again")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (ValueError, RecursionError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(f"{index} holds no weight_map of shard file names; the file is damaged, copy it again")
    names = sorted(set(weight_map.values()))
    bad = [n for n in names if Path(n).name != n or n in ("", ".", "..") or not (folder / n).is_file()]
    if bad:
        raise ConfigError(f"{index} names the shard {bad[0]!r}, which is not a file in {folder}; copy every shard")
    return [folder / n for n in names]


def checkpoint_shapes(folder: str | Path) -> dict[str, tuple[int, ...]] | None:
    """{tensor: shape} of the folder's safetensors weights (a sharded index's shards together); None when the
    folder holds only pickled ``pytorch_model.bin`` weights."""
    folder = Path(folder).expanduser()
    if (folder / SINGLE).is_file():
        return tensor_shapes(folder / SINGLE)
    if (folder / INDEX).is_file():
        shapes: dict[str, tuple[int, ...]] = {}
        for shard in _shards(folder):
            shapes.update(tensor_shapes(shard))
        return shapes
    return None


def expected_shapes(folder: str | Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(base model prefix, {tensor: shape} in the model's order) of the model the folder's config.json builds
    (a causal LM with its head, an encoder without one), built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from collapipe_flwr.models.hf.loading import quiet_transformers
    from collapipe_flwr.models.hf_arch import CAUSAL_LM_TYPES

    with quiet_transformers():
        try:
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as err:  # noqa: BLE001 - a damaged config.json raises anything from OSError to TypeError
            first = (str(err).splitlines() or [type(err).__name__])[0][:120]
            raise ConfigError(f"cannot read the config.json of {folder} ({first}); copy it again") from None
        auto = AutoModelForCausalLM if config.model_type in CAUSAL_LM_TYPES else AutoModel
        with torch.device("meta"):
            model = auto.from_config(config)
    kept = model.state_dict().keys()
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n in kept)]
    return model.base_model_prefix, {name: tuple(t.shape) for name, t in tensors if not name.startswith(FRESH)}


def _plain(name: str, prefix: str) -> str:
    """``name`` as transformers matches it: without the base model's prefix, gamma / beta as weight / bias."""
    name = name.removeprefix(f"{prefix}.")
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith(old):
            name = name[: -len(old)] + new
    return name


def missing_weights(folder: str | Path) -> list[str]:
    """The tensors the folder's model needs and its safetensors weights lack, in the model's order (a wrong-shaped
    tensor, or a damaged header, is a one-line ConfigError); [] for a folder of pickled weights."""
    found = checkpoint_shapes(folder)
    if found is None:
        return []
    prefix, wanted = expected_shapes(folder)
    have = {_plain(name, prefix): shape for name, shape in found.items()}
    missing = []
    for name, shape in wanted.items():
        got = have.get(_plain(name, prefix))
        if got is None:
            missing.append(name)
        elif got != shape:
            raise ConfigError(
                f"{name} in {folder} has shape {list(got)} but its config.json's model needs {list(shape)}; the "
                "weights and config.json do not belong together: copy the matching pair"
            )
    return missing


def check_folder_weights(folder: str | Path, allow_missing: bool) -> list[str]:
    """:func:`missing_weights`, refused in one line naming the first unless ``allow_missing``."""
    missing = missing_weights(folder)
    if missing and not allow_missing:
        total = len(expected_shapes(folder)[1])
        raise ConfigError(
            f"model.hf_folder={str(folder)!r} holds no {missing[0]} ({len(missing)} of the model's {total} weights "
            f"missing); copy the complete weights into the folder, or set {ALLOW_KEY}=true to train them from "
            "random values"
        )
    return missing


def check_loading_info(folder: str, info: dict, allow_missing: bool) -> list[str]:
    """The weights transformers' load report (``output_loading_info``) says it filled with random values, refused
    unless ``allow_missing`` (the check for folders :func:`missing_weights` cannot read)."""
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.split(".", 1)[-1].startswith(FRESH))
    if missing and not allow_missing:
        raise ConfigError(
            f"model.hf_folder={folder!r} holds no {missing[0]} ({len(missing)} weights missing); copy the complete "
            f"weights into the folder, or set {ALLOW_KEY}=true to train them from random values"
        )
    return missing


def random_weights_record(hf) -> dict:
    """``{"random_weights": {count, first}}`` for a run's summary when its model folder (``HfSpec``) lacked weights
    that ``model.allow_missing_weights`` let train from random values; {} otherwise."""
    if hf is None or not hf.allow_missing_weights or not hf.hf_folder or hf.gguf_file:
        return {}
    from collapipe_flwr.models.packaged import resolve_folder

    folder = Path(resolve_folder(hf.hf_folder)).expanduser()
    missing = missing_weights(folder) if folder.is_dir() else []
    return {"random_weights": {"count": len(missing), "first": missing[0]}} if missing else {}
