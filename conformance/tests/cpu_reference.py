"""Ours: what the model testers' own checks use to compare the test device
with the CPU: the same weights on both, inputs moved, gradients compared."""

import contextlib
import copy

import torch

from transformers import set_seed
from transformers.testing_utils import torch_device

ATOL = 1e-4
RTOL = 1e-4


def pair(model_class, config):
    """The same weights on the CPU and on the test device, in eval mode."""
    set_seed(0)
    cpu = model_class(copy.deepcopy(config)).eval()
    dev = copy.deepcopy(cpu).to(torch_device).eval()
    return cpu, dev


def on(inputs, device):
    """The tensors of a dict of inputs moved to `device` (the rest as is)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@contextlib.contextmanager
def only(test, *classes):
    """Runs a common test over some of the test class's model classes."""
    test.all_model_classes = classes
    try:
        yield
    finally:
        del test.all_model_classes


def assert_grads_match(test, dev, cpu, atol=ATOL, rtol=1e-3):
    """Every parameter's gradient on the device equals the CPU's (or both have none)."""
    for (name, p_dev), (_, p_cpu) in zip(dev.named_parameters(), cpu.named_parameters()):
        if p_cpu.grad is None:
            test.assertIsNone(p_dev.grad, name)
            continue
        test.assertIsNotNone(p_dev.grad, name)
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, atol=atol, rtol=rtol,
                                   msg=lambda m: f"grad of {name}: {m}")


def assert_training_matches(test, model_class, config, inputs, logits_shape=None):
    """One training-mode forward and backward of `model_class` from the same
    weights on the device and on the CPU: the logits (which must have
    `logits_shape`, when given), the loss, and every parameter's gradient."""
    cpu, dev = pair(model_class, config)
    cpu.train()
    dev.train()
    out_dev = dev(**on(inputs, torch_device))
    out_cpu = cpu(**on(inputs, "cpu"))
    if logits_shape is not None:
        test.assertEqual(out_dev.logits.shape, logits_shape)
        torch.testing.assert_close(out_dev.logits.cpu(), out_cpu.logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out_dev.loss.cpu(), out_cpu.loss, atol=ATOL, rtol=RTOL)
    out_dev.loss.backward()
    out_cpu.loss.backward()
    assert_grads_match(test, dev, cpu)
