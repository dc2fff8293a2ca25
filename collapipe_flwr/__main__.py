"""``python -m collapipe_flwr run ...``: the same as the ``collapipe`` console script (collapipe_flwr/cli.py)."""

from collapipe_flwr.cli import main

raise SystemExit(main())
