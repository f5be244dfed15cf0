"""torch.tpu.optimizers: torch.optim's updates, each step one program."""

import pytest
import torch

CASES = {
    "AdamW": (lambda: torch.tpu.optimizers.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "AdamW_amsgrad": (lambda: torch.tpu.optimizers.AdamW, torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    "Sgd": (lambda: torch.tpu.optimizers.Sgd, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "Muon": (lambda: torch.tpu.optimizers.Muon, torch.optim.Muon, dict(lr=0.02)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_steps_match_torch_on_cpu_and_are_one_program(name, mode, no_fallback, monkeypatch):
    tpu_cls, cpu_cls, kwargs = CASES[name]
    g = torch.Generator().manual_seed(11)
    # Muon takes matrices only; the others a vector too.
    shapes = [(16, 32), (8, 16)] + ([] if name == "Muon" else [(8,)])
    cpu = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    dev = [p.detach().to("tpu").requires_grad_() for p in cpu]
    opt_cpu, opt_dev = cpu_cls(cpu, **kwargs), tpu_cls()(dev, **kwargs)
    launched = []
    real = torch.tpu.mark_step
    monkeypatch.setattr(torch.tpu, "mark_step", lambda d=None: launched.append(real(d)) or launched[-1])
    for step in range(3):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, q, gr in zip(cpu, dev, grads):
            p.grad, q.grad = gr.clone(), gr.to("tpu")
        opt_cpu.step()
        opt_dev.step()
        assert torch.tpu.eager_mode() == mode
    # Muon's Newton-Schulz iterations run in bf16, as torch's do.
    tol = dict(atol=2e-3, rtol=2e-3) if name == "Muon" else dict(atol=1e-5, rtol=1e-5)
    for p, q in zip(cpu, dev):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **tol)
    # Each step ended in one launch of everything it recorded.
    assert len(launched) == 3 and all(n > 0 for n in launched), launched
    assert opt_dev.last_step_ops == launched[-1]
    if name == "Muon":
        assert min(launched) >= 2 * 5 * 3, launched  # two matrices, five rounds of three products


def test_a_closure_and_parameters_off_tpu():
    w = torch.zeros(4, 4, requires_grad=True)
    opt = torch.tpu.optimizers.Sgd([w], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (w - 1).square().sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 16.0
    torch.testing.assert_close(w.detach(), torch.ones(4, 4))
    assert not hasattr(opt, "last_step_ops")  # CPU parameters: torch.optim's step
    assert torch.tpu.optimizers.AdamW([torch.zeros(2, requires_grad=True)]).defaults["fused"] is True
