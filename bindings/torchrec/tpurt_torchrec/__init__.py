"""TorchRec on tpurt's ``tpu`` device (bindings/torchrec).

``import tpurt_torchrec`` gives the ``torchrec::`` embedding ops that
TorchRec's TPU path calls (``torchrec.experimental.torch_tpu``: the
``TPUEmbeddingUnfused``, ``TPUEmbeddingBagUnfused`` and
``PallasTableBatchedEmbeddingBags`` modules) a kernel for the ``tpu``
device, built from tpu ops that run natively (see :mod:`.ops`).
TorchRec's plain ``EmbeddingBagCollection`` with a ``KeyedJaggedTensor``
on ``tpu`` needs nothing from here: it runs on the binding's native
embedding_bag.

It also installs tpurt's SparseCore input preprocessing (see
:mod:`.preprocessing`) under the name of TorchRec's missing C++ backend, so
TorchRec's ``SparseCoreInputPreprocessor`` and
``SparseCoreFusedEmbeddingBagCollection`` (whose
``torchrec_torch_tpu::sparse_dense_matmul_*`` ops call ``torch.tpu.ops``)
run on ``tpu``.
"""

import sys

import torchrec.experimental.torch_tpu.datasets as _datasets

from . import preprocessing
from .ops import registered_ops

_BACKEND = "torchrec.experimental.torch_tpu.datasets.pybind_input_preprocessing"
sys.modules[_BACKEND] = preprocessing
_datasets.pybind_input_preprocessing = preprocessing

__all__ = ["preprocessing", "registered_ops"]
