"""The tests' way to end a round without Flower: fold the CUs' replies in the way the strategy does."""

from __future__ import annotations

from collapipe_flwr.fl.messages import NUM_EXAMPLES
from collapipe_flwr.fl.server.server_state import ServerState


def absorb_replies(server: ServerState, t: int, replies: list[tuple[int, dict, dict]]) -> None:
    """Round t's replies (cluster n, returned parts, reply metrics), in arrival order: each folded into the round's
    RoundFold with its num-examples, then the new global model and the CUs' losses (``CollaPipeStrategy``)."""
    fold = server.global_model.new_round()
    for cluster, parts, metrics in replies:
        fold.add(cluster, parts, float(metrics[NUM_EXAMPLES]))
    server.absorb_round(t, fold, {cluster: float(metrics["train-loss"]) for cluster, _, metrics in replies})
