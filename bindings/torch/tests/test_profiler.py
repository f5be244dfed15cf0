"""torch.tpu.profiler: device time per task and kernel, on both platforms."""

import json

import pytest
import torch

HOST = torch.tpu.platform() == "host"


def test_strict_ops_are_tasks_with_their_kernels():
    x = torch.randn(64, 300, device="tpu")
    torch.tpu.synchronize()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        with torch.tpu.profiler.profile() as prof:
            y = torch.softmax(x, -1)
            z = y * 3
    tasks = prof.key_averages("task")
    names = [a.key for a in tasks]
    assert "softmax" in names and "mul" in names, names
    softmax = next(a for a in tasks if a.key == "softmax")
    assert softmax.count == 1 and softmax.total_us > 0
    assert softmax.min_us <= softmax.mean_us <= softmax.max_us
    events = prof.events()
    # Both on the default stream, which is a stream of the runtime's own.
    streams = {e.stream for e in events if e.kind == "task" and e.name in ("softmax", "mul")}
    assert len(streams) == 1 and 0 not in streams, events
    if HOST:
        kernels = [e for e in events if e.kind == "kernel"]
        assert any(e.name.startswith("rows [64,300] (3 phases, by row blocks)") for e in kernels), kernels
        # A task's kernels lie inside it.
        task = next(e for e in events if e.name == "softmax")
        rows = next(e for e in kernels if e.name.startswith("rows"))
        assert task.start_us <= rows.start_us
        assert rows.start_us + rows.duration_us <= task.start_us + task.duration_us + 1e-3
    assert z.shape == x.shape


def test_a_deferred_recording_is_one_task_and_leaving_the_block_flushes_it():
    x = torch.randn(128, 256, device="tpu")
    torch.tpu.synchronize()
    with torch.tpu.profiler.profile() as prof:
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            y = torch.nn.functional.gelu(x * 2 + 1)
            z = torch.layer_norm(y, (256,))
        # Nothing synchronized here: leaving the profile flushes the recording.
    tasks = [e for e in prof.events() if e.kind == "task" and e.name.startswith("fused ")]
    assert len(tasks) == 1, prof.events()
    assert "gelu" in tasks[0].name or "layer_norm" in tasks[0].name, tasks[0].name
    if HOST:
        kernels = prof.key_averages("kernel")
        assert kernels and all(a.kind == "kernel" for a in kernels)
    assert torch.allclose(z.cpu(), torch.layer_norm(torch.nn.functional.gelu(x.cpu() * 2 + 1), (256,)),
                          atol=1e-5)


def test_tasks_name_their_stream():
    x = torch.randn(1000, device="tpu")
    side = torch.tpu.Stream()
    torch.tpu.synchronize()
    with torch.tpu.profiler.profile() as prof:
        x.exp()
        with torch.tpu.stream(side):
            x.sin()
    stream_of = {e.name: e.stream for e in prof.events() if e.kind == "task"}
    assert stream_of["exp"] != stream_of["sin"], stream_of


def test_only_work_inside_the_block_is_recorded():
    x = torch.randn(1000, device="tpu")
    x.exp()
    with torch.tpu.profiler.profile() as first:
        x.sin()
    x.cos()
    with torch.tpu.profiler.profile() as second:
        x.tanh()
    assert [a.key for a in first.key_averages("task")] == ["sin"]
    assert [a.key for a in second.key_averages("task")] == ["tanh"]


def test_one_recording_at_a_time():
    with torch.tpu.profiler.profile():
        with pytest.raises(RuntimeError, match="already recording"):
            with torch.tpu.profiler.profile():
                pass
    # The first one stopped cleanly: a new one starts.
    with torch.tpu.profiler.profile() as prof:
        torch.ones(4, device="tpu").add_(1)
    assert prof.events()


def test_table_and_chrome_trace(tmp_path):
    x = torch.randn(256, 256, device="tpu")
    with torch.tpu.profiler.profile() as prof:
        for _ in range(3):
            x = torch.relu(x @ x) / 256
    table = prof.key_averages().table(row_limit=2)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["Name", "Kind", "Calls"]
    assert len([line for line in lines[2:] if not line.endswith(" ms")]) == 2, table
    assert "task time:" in table
    assert any(a.key == "mm" and a.count == 3 for a in prof.key_averages("task")), table
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="cuda_time")
    with pytest.raises(ValueError, match="kind"):
        prof.key_averages("op")
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert trace["traceEvents"] and all(e["ph"] == "X" and e["dur"] >= 0 for e in trace["traceEvents"])
    assert {e["cat"] for e in trace["traceEvents"]} <= {"task", "kernel"}
