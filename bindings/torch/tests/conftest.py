import pytest
import torch

import tpurt  # noqa: F401  (registers tpu even when torch's autoload is off)

MODES = [
    torch.tpu.EagerMode.DEFER_NEVER,
    torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
    torch.tpu.EagerMode.DEFER_AND_FUSE,
]


@pytest.fixture(params=MODES, ids=lambda m: m.name.lower())
def mode(request):
    """Runs the test once in each eager mode."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


@pytest.fixture
def no_fallback():
    """The CPU fallback off: the test passes only on native kernels."""
    was = torch.tpu.cpu_fallback_enabled()
    torch.tpu.enable_cpu_fallback(False)
    try:
        yield
    finally:
        torch.tpu.enable_cpu_fallback(was)
