"""TorchRec on tpurt's ``tpu`` device (bindings/torchrec).

``import tpurt_torchrec`` gives the ``torchrec::`` embedding ops that
TorchRec's TPU path calls (``torchrec.experimental.torch_tpu``: the
``TPUEmbeddingUnfused``, ``TPUEmbeddingBagUnfused`` and
``PallasTableBatchedEmbeddingBags`` modules) a kernel for the ``tpu``
device, built from tpu ops that run natively (see :mod:`.ops`).
TorchRec's plain ``EmbeddingBagCollection`` with a ``KeyedJaggedTensor``
on ``tpu`` needs nothing from here: it runs on the binding's native
embedding_bag.
"""

from .ops import registered_ops

__all__ = ["registered_ops"]
