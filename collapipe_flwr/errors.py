"""User-facing errors: one line that names what is wrong and how to fix it.

Entry points catch :class:`CollaPipeError` and print ``error: <message>`` instead of a traceback.
"""

from __future__ import annotations


class CollaPipeError(Exception):
    """Base of every error caused by user input (config, data file, message, device). Not a ``ValueError``: a
    device failure or a refused data-plane frame is not a bad argument; only :class:`ConfigError` is one."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class ConfigError(CollaPipeError, ValueError):
    """A configuration value is missing, of the wrong type or out of range (also a ``ValueError``)."""


class StateMismatchError(CollaPipeError):
    """Weights or optimizer state that do not fit the module they are loaded into at run time (another model
    config, a damaged or foreign upload): not a configuration error, though a config change is the usual cause."""


class PartitionError(CollaPipeError):
    """A block partition delta = (delta_1..delta_K) is not valid for the encoder or the devices."""


class DataFormatError(CollaPipeError):
    """A dataset file is missing or does not have the expected format."""


class InfeasiblePlanError(CollaPipeError):
    """No plan satisfies the constraints C1-C9 for the round's state."""


class DataPlaneError(CollaPipeError):
    """A per-step data-plane request was refused or the channel failed."""


class DeviceFailure(CollaPipeError):
    """A device actor died or timed out during a step; ``device`` is its index k in the cluster when known;
    ``reason`` is ``"memory"`` when the kernel killed it for going over its memory limit (C7 on the testbed),
    else ``""``."""

    def __init__(self, message: str, device: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.device = device
        self.reason = reason


class CannotContinue(CollaPipeError):
    """A failure every later round would repeat until the user acts (a CU's damaged state file): a CU that hits
    one says so in its reply, and the server stops the run with it instead of going on without that CU."""


class UnsupportedModelError(CollaPipeError):
    """A Hugging Face model whose architecture the splitter (``models/hf``) cannot cut into embedding / TEBs / head."""


class TestbedError(CollaPipeError):
    """The emulated edge testbed cannot be set up here (no cgroup cpu controller, not root) or was misused."""


def exit_on_user_error(func):
    """Decorate a ``main()`` so a :class:`CollaPipeError` prints one line and exits with code 2."""
    import functools
    import sys

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except CollaPipeError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper
