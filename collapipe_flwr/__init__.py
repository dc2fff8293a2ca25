"""collapipe-flwr: CollaPipe (segment-optimised pipeline parallelism + federated aggregation) on Flower."""

__version__ = "0.1.0"
