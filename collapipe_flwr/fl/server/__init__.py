"""The edge server: a Flower ServerApp that plans each round with DSSRA, hosts the decoder (or task head),
aggregates the clusters' encoders, evaluates and checkpoints."""
