"""One configuration object, validated once at start-up.

Hydra's ``conf/`` is the source of truth. ``compose(overrides)`` builds the config from ``conf/config.yaml``
(used by the ServerApp, which receives the overrides as one run-config string, and by tests);
``python -m collapipe_flwr.experiments`` gets the same tree from ``@hydra.main``. Either way
:func:`build_run_config` turns the plain mapping into a frozen :class:`RunConfig`, raising a one-line
:class:`~collapipe_flwr.errors.ConfigError` that names the key and how to fix it.

Every section is parsed once, by the parser of the package that owns it (grep ``def parse_``):

=========== ==================================== ===========================================
section     spec                                 parser
=========== ==================================== ===========================================
task        ``tasks.spec.TaskSpec``              ``tasks.spec.parse_task``
model       ``tasks.spec.ModelSpec``             ``tasks.spec.parse_model``
method      ``dssra.specs.MethodSpec``           ``dssra.specs.parse_method``
scheduler   ``dssra.specs.SchedulerSpec``        ``dssra.specs.parse_scheduler``
network     ``system.network.NetworkSpec``       ``system.network.NetworkSpec.from_config``
runtime     ``pipeline.runtime_spec.RuntimeSpec`` ``pipeline.runtime_spec.parse_runtime``
federation  :class:`FederationSpec`              ``spec_parsing.typed`` (here)
pipeline    :class:`PipelineSpec`                ``spec_parsing.typed`` (here)
dataplane   :class:`DataPlaneSpec`               ``sections.parse_dataplane`` (here)
eval        :class:`EvalSpec`                    ``spec_parsing.typed`` (here)
system      ``system.measurement_spec.SystemSpec`` ``system.measurement_spec.parse_system``
testbed     ``system.measurement_spec.TestbedSpec`` ``system.measurement_spec.parse_testbed``
=========== ==================================== ===========================================

:func:`build_run_config` (the server, the sweep, ``train_central``, ``simulate``, benchmarks) and
:func:`build_cluster_config` (a CU, from the part the server sends) call those parsers. The ServerApp sends
a CU only :class:`ClusterConfig` (``RunConfig.cluster_config``): a CU on a real edge box needs no copy of
``conf/`` and never sees the scheduler, network, method or eval sections.

Modules: ``data_dir`` (conf/ and the data folder), ``sections`` (the sections parsed here), ``hydra_conf``
(composing conf/ with overrides), ``run_config`` (the config objects and their builders), ``load``
(compose + build), ``round_adapters`` (the ``round_adapters`` section, parsed with ``spec_parsing.typed``: a
LoRA causal LM's adapters in PEFT's format every k rounds).
"""

from collapipe_flwr.config.data_dir import (
    CONF_DIR,
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR_NAME,
    default_data_dirs,
    resolve_data_dir,
)
from collapipe_flwr.config.hydra_conf import compose, names_group, split_overrides, with_task_default_model
from collapipe_flwr.config.load import load_run_config
from collapipe_flwr.config.privacy import PrivacyMode, PrivacySpec
from collapipe_flwr.config.run_config import (
    AnyConfig,
    ClusterConfig,
    RunConfig,
    build_cluster_config,
    build_run_config,
)
from collapipe_flwr.config.sections import DataPlaneSpec, EvalSpec, FederationSpec, PipelineSpec

__all__ = [
    "CONF_DIR",
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR_NAME",
    "AnyConfig",
    "ClusterConfig",
    "DataPlaneSpec",
    "EvalSpec",
    "FederationSpec",
    "PipelineSpec",
    "PrivacyMode",
    "PrivacySpec",
    "RunConfig",
    "build_cluster_config",
    "build_run_config",
    "compose",
    "default_data_dirs",
    "load_run_config",
    "names_group",
    "resolve_data_dir",
    "split_overrides",
    "with_task_default_model",
]
