"""The Flower names this project takes from outside Flower's public API, each with the reason, in one place.

Everything else comes from Flower's public packages (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
``flwr.common.log``). Checked against flwr 1.41 and 1.42 (the supported range in pyproject.toml); when Flower
moves one of these, this module is the one to change.

- ``parse_config_args`` (``flwr.common.config``): ``collapipe run`` reads ``--run-config`` exactly as ``flwr run``
  does ("k=v ..." strings or a TOML file) before it starts Flower, so a bad key is refused with the same parsing
  Flower would apply; Flower exposes the parser only inside its CLI package.
- ``TaskIdentity`` (``flwr.supercore.task_identity``): a ``Message`` can only be built inside a Flower run (it
  reads the run, node and task ids from there); the in-process grid of the tests and the scaling benchmark give
  their process that identity, as a SuperNode's task worker does. Never used by the package itself.
"""

from __future__ import annotations

from flwr.common.config import parse_config_args
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["TaskIdentity", "parse_config_args"]
