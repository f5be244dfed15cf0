import pytest
import torch

import tpurt_torchrec  # noqa: F401  (registers tpu and TorchRec's tpu paths)


@pytest.fixture(autouse=True)
def native():
    """The CPU fallback off: every test passes on native kernels only."""
    was = torch.tpu.cpu_fallback_enabled()
    torch.tpu.enable_cpu_fallback(False)
    yield
    torch.tpu.enable_cpu_fallback(was)
