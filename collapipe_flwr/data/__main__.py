"""``python -m collapipe_flwr.data check|prepare`` (see :mod:`collapipe_flwr.data.cli`)."""

from collapipe_flwr.data.cli import main

raise SystemExit(main())
