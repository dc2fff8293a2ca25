"""What a selected CU sends the BS per round under a method's flags (eq. 11)."""

from __future__ import annotations

from collapipe_flwr.dssra.specs import MethodSpec
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.system.workload import Workload


def method_uplink_bits(method: MethodSpec, workload: Workload) -> float:
    """Bits a selected CU sends the BS per round (eq. 11): z_enc of every local step when
    ``head_on_server``; the encoder and embedding (plus the head when it trains on the devices) when
    ``aggregate``; of the encoder only its trainable tensors (LoRA: the adapters, ``Workload.trainable_bytes``)."""
    nbytes = 0.0
    if method.head_on_server:
        nbytes += workload.boundary_bytes[-1] * workload.batch_size * workload.steps_per_round  # z_enc per step
    if method.aggregate:
        nbytes += workload.encoder_upload_bytes + workload.extra_upload_bytes
        if not method.head_on_server:
            nbytes += workload.head_bytes
    if nbytes <= 0:
        raise ConfigError(
            f"method {method.name} uploads nothing (head_on_server and aggregate both false); set one of them to true"
        )
    return 8.0 * nbytes
