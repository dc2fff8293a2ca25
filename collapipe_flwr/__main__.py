"""``python -m collapipe_flwr run ...``: the same as the ``collapipe`` console script (collapipe_flwr/apps/cli.py)."""

from collapipe_flwr.apps.cli import main

raise SystemExit(main())
