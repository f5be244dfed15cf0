"""Registration, creation, copies, views and metadata on `tpu`."""

import copy

import pytest
import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


def test_tpu_is_a_registered_device():
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 4
    assert torch.tpu.platform() in ("host", "xla")
    t = torch.ones(2, device="tpu")
    assert t.device == torch.device("tpu", 0)
    assert t.is_tpu
    assert torch.ones(2).tpu().device.type == "tpu"
    props = torch.tpu.get_device_properties(1)
    assert props.index == 1 and props.total_memory > 0
    assert len(props.coords) == len(torch.tpu.topology())


def test_torch_tpu_submodules_import_by_their_dotted_names():
    # TorchTPU's torch.tpu is a package: code imports its submodules by name.
    import importlib

    for name in ("ops", "profiler", "distributed", "optimizers", "compiler"):
        assert importlib.import_module(f"torch.tpu.{name}") is getattr(torch.tpu, name)
    from torch.tpu.profiler import profile

    assert profile is torch.tpu.profiler.profile
    import torch.tpu.ops as tpu_ops

    assert tpu_ops is torch.tpu.ops and callable(tpu_ops.sparse_dense_matmul)
    with pytest.raises(ModuleNotFoundError, match="torch.tpu.nonesuch"):
        importlib.import_module("torch.tpu.nonesuch")


def test_torch_backends_entry_point_registers_tpu_at_import_torch():
    import importlib.metadata as md

    names = [e.value for e in md.entry_points(group="torch.backends")]
    assert "tpurt:_autoload" in names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_round_trip_every_dtype(dtype, mode):
    x = (torch.arange(-6, 18).reshape(4, 6) % 7).to(dtype)
    t = x.to("tpu")
    assert t.dtype == dtype
    assert torch.equal(t.cpu(), x)
    # Strided both ways: a transposed source and a transposed destination.
    assert torch.equal(x.t().to("tpu").cpu(), x.t())
    dst = torch.zeros(6, 4, dtype=dtype, device="tpu")
    dst.t().copy_(x)
    assert torch.equal(dst.cpu(), x.t().contiguous())


def test_factories(mode, no_fallback):
    assert torch.equal(torch.zeros(3, 2, device="tpu").cpu(), torch.zeros(3, 2))
    assert torch.equal(torch.ones(5, dtype=torch.int32, device="tpu").cpu(), torch.ones(5, dtype=torch.int32))
    assert torch.equal(torch.full((2, 2), 7.5, device="tpu").cpu(), torch.full((2, 2), 7.5))
    assert torch.equal(torch.arange(3, 17, 2, device="tpu").cpu(), torch.arange(3, 17, 2))
    assert torch.allclose(torch.arange(0, 1, 0.125, device="tpu").cpu(), torch.arange(0, 1, 0.125))
    e = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert e.stride() == (1, 2)


def test_views_alias_their_base(mode, no_fallback):
    base = torch.zeros(4, 6, device="tpu")
    row = base[1]
    col = base[:, 2]
    tr = base.t()
    flat = base.view(24)
    row.add_(1)
    col.fill_(5)
    tr[0, 3] = 9
    flat[23] = -1
    expect = torch.zeros(4, 6)
    expect[1] += 1
    expect[:, 2] = 5
    expect[3, 0] = 9
    expect.view(24)[23] = -1
    assert torch.equal(base.cpu(), expect)
    # Views share the storage: one device address range.
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert row.data_ptr() == base.data_ptr() + 6 * 4
    u = torch.arange(10.0, device="tpu").unfold(0, 4, 3)
    assert torch.equal(u.cpu(), torch.arange(10.0).unfold(0, 4, 3))
    s = torch.arange(12.0, device="tpu").as_strided((3, 2), (4, 1), 1)
    assert torch.equal(s.cpu(), torch.arange(12.0).as_strided((3, 2), (4, 1), 1))


def test_an_in_place_update_reading_its_own_tensor_through_a_view(mode, no_fallback):
    # x[0] += (a broadcast of x's first column)[0]: on the xla platform in
    # defer mode XLA fused the update into the in-place write and read
    # x[0, 0] after overwriting it (row 0 came out [0, x01, x02, x03]).
    def f(t):
        x = t.exp()
        d = -(x.as_strided((4, 4), (4, 0)))
        x[0] += d[0]
        y = -(t.T)
        y += x
        return x, y
    t = torch.arange(16.0).reshape(4, 4) / 10 - 0.5
    for out, ref in zip(f(t.to("tpu")), f(t)):
        torch.testing.assert_close(out.cpu(), ref)


def test_distinct_tensors_never_overlap():
    ts = [torch.empty(n, device="tpu") for n in (1, 100, 5000, 300000)]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in ts)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start


def test_storages_and_deepcopy(no_fallback):
    # torch.UntypedStorage(n, device=...) finds the allocator by device type
    # (it was unregistered: a segfault); Storage.clone and deepcopy use it.
    s = torch.UntypedStorage(12, device="tpu")
    assert s.device.type == "tpu" and s.nbytes() == 12
    t = torch.arange(6.0, device="tpu")
    c = copy.deepcopy(t)
    assert c.device.type == "tpu" and c.data_ptr() != t.data_ptr()
    t.zero_()
    assert torch.equal(c.cpu(), torch.arange(6.0))
    clone = t.untyped_storage().clone()
    assert clone.device.type == "tpu" and clone.nbytes() == t.nbytes
    lin = torch.nn.Linear(3, 2).to("tpu")
    lin2 = copy.deepcopy(lin)
    assert torch.equal(lin2.weight.cpu(), lin.weight.cpu())


def test_resize_and_set_keep_contents(no_fallback):
    t = torch.arange(6.0, device="tpu")
    t.resize_(10)
    assert torch.equal(t[:6].cpu(), torch.arange(6.0))
    u = torch.empty(0, device="tpu")
    u.set_(t.untyped_storage(), 2, (2, 2), (2, 1))
    assert torch.equal(u.cpu(), torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    u.mul_(10)
    assert t[2].item() == 20.0
    w = torch.empty(0, device="tpu").set_(t)
    assert w.data_ptr() == t.data_ptr()


def test_item_and_scalars(mode, no_fallback):
    t = torch.tensor([1.5, -2.0], device="tpu")
    assert t[0].item() == 1.5
    assert (t + 1).tolist() == [2.5, -1.0]
    assert (t * torch.tensor(2.0)).tolist() == [3.0, -4.0]  # a CPU 0-dim tensor joins in
    assert (2 - t).tolist() == [0.5, 4.0]
    assert (t > 0).tolist() == [True, False]


def test_copies_between_devices(mode):
    a = torch.arange(12.0, device="tpu:0").reshape(3, 4)
    b = a.to("tpu:3")
    assert b.device == torch.device("tpu:3")
    assert torch.equal(b.cpu(), a.cpu())
    c = torch.zeros(4, 3, device="tpu:3", dtype=torch.float64)
    c.copy_(a.t())
    assert torch.equal(c.cpu(), torch.arange(12.0).reshape(3, 4).t().double())
    with pytest.raises(RuntimeError, match="tpu:0"):
        _ = a + b


def test_module_to_keeps_tied_weights_tied():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head}).to("tpu")
    assert model["emb"].weight is model["head"].weight
    assert model["emb"].weight.device.type == "tpu"


def test_bad_input_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="ComplexFloat is not supported"):
        torch.zeros(2, dtype=torch.complex64, device="tpu")
    with pytest.raises(IndexError, match="out of range"):
        torch.zeros(2, device="tpu:9")
    with pytest.raises(RuntimeError):
        torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")


def test_an_out_of_range_index_is_an_error_on_every_platform():
    """torch refuses an index past the dimension; so does tpu, on the host
    platform and on xla (where XLA alone would clamp it), when the stream
    is next synchronized; the stream is then reset and works again."""
    x = torch.arange(4.0, device="tpu")
    s = torch.tpu.Stream()
    s.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s):
        bad = torch.tensor([1, 5], device="tpu")
        y = x.index_select(0, bad)
    with pytest.raises(RuntimeError, match=r"take: index 5 at position \[1\] is out of range: axis 0 has size 4"):
        s.synchronize()
    s.reset()
    with torch.tpu.stream(s):
        ok = x.index_select(0, torch.tensor([3, 0], device="tpu"))
    s.synchronize()
    assert ok.cpu().tolist() == [3.0, 0.0]
    del y
