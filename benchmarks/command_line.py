"""A benchmark's command line from its defaults: one ``--name value`` option a default (``--seq-len`` for
``seq_len``), its type the default's, a list default taking one or more values."""

from __future__ import annotations

import argparse


def parse(doc: str, argv: list[str] | None = None, **defaults) -> argparse.Namespace:
    """The options ``defaults`` names, parsed from ``argv`` (default: the process's); ``doc``: the script's
    docstring, whose first line describes it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, list):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser.parse_args(argv)
