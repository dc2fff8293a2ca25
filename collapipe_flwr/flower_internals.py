"""The Flower names this project takes from outside Flower's public API, each with the reason, in one place.

Everything else comes from Flower's public packages (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
``flwr.common.log``). Checked against flwr 1.41 and 1.42 (the supported range in pyproject.toml); when Flower
moves one of these, this module is the one to change.

- ``parse_config_args`` (``flwr.common.config``): ``collapipe run`` reads ``--run-config`` exactly as ``flwr run``
  does ("k=v ..." strings or a TOML file) before it starts Flower, so a bad key is refused with the same parsing
  Flower would apply; Flower exposes the parser only inside its CLI package.
- ``KEY_CLIPPING_NORM``, ``compute_stdv`` (``flwr.supercore.differential_privacy``):
  central DP (``privacy.mode: central``) uses Flower's own client-side clipping mod, which reads the clipping
  norm under this key from the train message, and the noise of Flower's
  ``DifferentialPrivacyClientSideFixedClipping`` wrapper. The wrapper itself cannot wrap this project's strategy
  (it noises the arrays a strategy returns; this strategy keeps the global model in its server state), so the
  server applies the same sigma to its aggregate (``fl/server/aggregation/central_dp.py``), drawn from a seeded
  generator so that a run is reproducible (Flower's ``add_gaussian_noise_inplace`` draws from NumPy's global state).
- ``TaskIdentity`` (``flwr.supercore.task_identity``): a ``Message`` can only be built inside a Flower run (it
  reads the run, node and task ids from there); the in-process grid of the tests and the scaling benchmark give
  their process that identity, as a SuperNode's task worker does. Never used by the package itself.
"""

from __future__ import annotations

from flwr.common.config import parse_config_args
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, compute_stdv
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["KEY_CLIPPING_NORM", "TaskIdentity", "compute_stdv", "parse_config_args"]
