"""The tensors of a safetensors file (name -> shape) read from its header alone, by safetensors itself.

``safe_open`` reads and validates only the header (its length against the file and safetensors' 100 MB limit,
the JSON, every tensor's dtype, shape and offsets against the data, which must cover the file exactly) and maps
nothing until a tensor is asked for; the shapes come from ``get_slice(name).get_shape()``, without reading a
tensor's bytes. Its errors (``SafetensorError``, a 2^63-byte header claim included) become one-line ConfigErrors
naming the file and safetensors' reason.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open

from collapipe_flwr.errors import ConfigError

_FIX = "the file is damaged or truncated; copy the model's weights again"


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the safetensors file ``path`` (one-line ConfigError when it cannot be read)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as file:
            return {str(name): tuple(int(d) for d in file.get_slice(name).get_shape()) for name in file.keys()}
    except SafetensorError as err:
        reason = " ".join(str(err).split())
        raise ConfigError(f"{path} is not a readable safetensors file ({reason}); {_FIX}") from None
    except OSError as err:
        raise ConfigError(f"cannot read {path} ({err.__class__.__name__}); check the file's permissions") from None
