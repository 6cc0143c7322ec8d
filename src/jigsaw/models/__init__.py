"""The model zoo: real networks for every variant of the example apps (torch, ONNX, TensorRT).

Importing this package does not import torch; the builders do, lazily. Install the ``models``
extra (``pip install jigsaw[models]``) to use them.
"""

from jigsaw.models.zoo import VariantInfo, variant_info

__all__ = ["VariantInfo", "variant_info"]
