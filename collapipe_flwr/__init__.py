"""collapipe-flwr: CollaPipe (segment-optimised pipeline parallelism + federated aggregation) on Flower."""

import logging

__version__ = "0.1.0"

# torchao (model.base_dtype: int8; peft and transformers import it whenever it is installed) logs a warning for
# each CUDA kernel library a CPU build of torch cannot load, and torch one for each enum torchao registers: off.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
