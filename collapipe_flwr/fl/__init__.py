"""The federated layer, split by where it runs (the paper's Fig. 2).

- ``fl.cu``: the cluster's control unit, a Flower ClientApp: the embedding, the device pipeline, the CU's round.
- ``fl.server``: the edge server, a Flower ServerApp: DSSRA's plan, the decoder, aggregation, checkpoints.
- ``fl.records``: the run's output folder (config.json, rounds.jsonl, summary.json), progress and plots.
- Shared by both sides: ``fl.messages`` (the Message API records) and ``fl.dataplane`` (the activation / gradient
  exchange between a CU and the server). Flower's flat run-config keys are read in ``config.flower_keys``.

The CU side never imports the server side and the reverse (import-linter contracts in pyproject.toml).
"""
