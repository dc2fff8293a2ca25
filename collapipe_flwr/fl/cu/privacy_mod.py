"""The ClientApp's privacy mod: Flower's own DP mods on a CU's upload, chosen per run by ``privacy.mode``.

A Flower ClientApp takes its mods when it is built, before any run config exists; this mod reads the run's
``privacy`` section from each train message's instructions and hands the message to Flower's ``LocalDpMod``
(``local``: clip to C, Gaussian noise on the CU) or ``fixedclipping_mod`` (``central``: clip to C; the server adds
the noise, fl/server/aggregation/central_dp.py), or straight on (``none``; every message that is not a train message).
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message, MessageType
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod

from collapipe_flwr.config import PrivacyMode, PrivacySpec
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.messages import INSTRUCTIONS, TrainInstructions

CallNext = Callable[[Message, Context], Message]


def privacy_of(msg: Message) -> PrivacySpec:
    """The run's ``privacy`` section from a train message (one-line CollaPipeError when malformed)."""
    record = msg.content.config_records.get(INSTRUCTIONS)
    if record is None:
        raise CollaPipeError("train message lacks its instructions; the server and CU run different versions")
    return TrainInstructions.from_record(record).cluster_config.privacy


def privacy_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Apply the run's DP mod to a train message's reply (see the module docstring)."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    try:
        privacy = privacy_of(msg)
    except CollaPipeError:  # the train handler answers a malformed message with its one-line error
        return call_next(msg, context)
    match privacy.mode:
        case PrivacyMode.LOCAL:
            mod = LocalDpMod(privacy.clipping_norm, privacy.clipping_norm, privacy.epsilon, privacy.delta)
            return mod(msg, context, call_next)
        case PrivacyMode.CENTRAL:
            return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)
