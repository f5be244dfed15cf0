"""A comparison the op tests share: a tpu result against torch's CPU one."""

import torch


def close_to_cpu(out, ref, tol):
    """`out` is on tpu and matches `ref` (on CPU) in dtype, shape and
    values, within `tol` absolute and relative."""
    assert out.device.type == "tpu"
    out = out.cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
