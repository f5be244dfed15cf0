"""What bindings/torch/valgrind/check.py runs under memcheck: one process
that goes through the binding's paths once each (creation and copies,
views that alias, ops and autograd in every eager mode, an optimizer
step, streams and events, the memory API, the CPU fallback, the
SparseCore ops, a copy between chips, bad input). Kept small: under
valgrind, importing torch alone takes minutes."""

import torch

import tpurt  # noqa: F401

dev = torch.device("tpu")
torch.manual_seed(0)

# Creation, copies, views that alias.
a = torch.arange(24.0).reshape(4, 6).to(dev)
v = a.view(6, 4)
v[0].fill_(7.0)
assert a.cpu()[0, :4].tolist() == [7.0] * 4
t = a.t().contiguous()
assert t.shape == (6, 4)

# Ops and autograd, an optimizer step, in every eager mode.
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(5, 8, device=dev)
y = torch.randint(0, 4, (5,), device=dev)
for mode in torch.tpu.EagerMode:
    with torch.tpu.set_eager_mode(mode):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        float(loss.detach())
attn = torch.nn.functional.scaled_dot_product_attention(
    torch.randn(1, 2, 4, 8, device=dev), torch.randn(1, 2, 4, 8, device=dev), torch.randn(1, 2, 4, 8, device=dev),
    is_causal=True,
)
emb = torch.nn.functional.embedding_bag(torch.tensor([0, 2, 1, 3], device=dev), torch.randn(5, 3, device=dev),
                                        torch.tensor([0, 2], device=dev), mode="mean")
torch.tpu.synchronize()

# Streams and events.
s = torch.tpu.Stream()
s.wait_stream(torch.tpu.current_stream())
with torch.tpu.stream(s):
    b = (a * 2).sum()
e = torch.tpu.Event()
e.record(s)
torch.tpu.current_stream().wait_event(e)
e.synchronize()
b.record_stream(s)
float(b)

# The memory API.
torch.tpu.memory_stats()
torch.tpu.memory_snapshot()
torch.tpu.handle_counts()
torch.tpu.empty_cache()

# The CPU fallback, then off.
torch.tpu.enable_cpu_fallback(True)
torch.linalg.eigvalsh(torch.eye(3, device=dev) * 2)
torch.tpu.enable_cpu_fallback(False)

# SparseCore ops.
rp = torch.tensor([6], dtype=torch.int32, device=dev)
ids = torch.tensor([0, 3, 3, 1, 4, 2, 0, 0], dtype=torch.int32, device=dev)
sids = torch.tensor([0, 0, 1, 1, 2, 2, 0, 0], dtype=torch.int32, device=dev)
gains = torch.ones(8, device=dev)
table = torch.randn(5, 4, device=dev)
out = torch.tpu.ops.sparse_dense_matmul(rp, ids, sids, gains, table, 3)
new, acc = torch.tpu.ops.sparse_dense_matmul_grad_with_adagrad(rp, ids, sids, gains, table, torch.zeros(5, 4, device=dev),
                                                               torch.ones(3, 4, device=dev), 0.1)
out.cpu(), new.cpu()

# A copy between chips.
if torch.tpu.device_count() > 1:
    c = a.to("tpu:1")
    assert torch.equal(c.cpu(), a.cpu())

# Bad input: clear errors, no crash.
for bad in (
    lambda: torch.ones(2, 3, device=dev) @ torch.ones(4, 5, device=dev),
    lambda: torch.zeros(2, device="tpu:99"),
    lambda: torch.tpu.ops.sparse_dense_matmul(rp, ids * 9, sids, gains, table, 3),
):
    try:
        bad()
    except (RuntimeError, ValueError, IndexError):
        pass
    else:
        raise AssertionError("bad input was accepted")
torch.tpu.synchronize()
print("workload done")
