"""The cluster's control unit (CU): a Flower ClientApp that runs the embedding, drives the cluster's device
pipeline (S stages, m micro-batches) and exchanges activations and gradients with the server's decoder."""
