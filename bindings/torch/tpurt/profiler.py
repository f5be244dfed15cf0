"""torch.tpu.profiler: what the device ran, and for how long.

    with torch.tpu.profiler.profile() as prof:
        loss = model(x).sum()
        loss.backward()
    print(prof.key_averages().table(row_limit=15))
    prof.export_chrome_trace("trace.json")  # chrome://tracing or Perfetto

Every task a stream runs is an event: an op's launch in strict mode, a
deferred recording's program under defer-and-fuse ("fused 600 ops (embedding
.. mul)"), a copy, an event wait. On the host platform so is every kernel
inside a program: a fused loop pass ("loop [8,128,688]: logistic mul mul"),
a row kernel (a softmax or a norm, phase by phase over blocks of rows), a
matrix product. Times are measured where the work ran, so they are device
time; a task's kernels lie inside it. The profiler is the process's own
(tpurt's C ABI `tpurt_profiler_start` / `tpurt_profiler_stop`): one
recording at a time, of every device and stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import torch

from . import _C

__all__ = ["profile", "ProfilerEvent", "EventAverage", "EventList"]


@dataclass(frozen=True)
class ProfilerEvent:
    """One task or kernel. Times in microseconds from the recording's start."""

    kind: str  # "task" or "kernel"
    name: str
    thread: str
    stream: int  # 0 for a kernel
    start_us: float
    duration_us: float


@dataclass(frozen=True)
class EventAverage:
    """Every event of one kind and name, summed (torch.profiler's key_averages row)."""

    key: str
    kind: str
    count: int
    total_us: float
    min_us: float
    max_us: float

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count


_SORT_KEYS = {
    "total": lambda a: -a.total_us,
    "count": lambda a: -a.count,
    "mean": lambda a: -a.mean_us,
    "max": lambda a: -a.max_us,
    "min": lambda a: -a.min_us,
    "name": lambda a: a.key,
}


class EventList(list):
    """A list of EventAverage rows, most total time first."""

    def table(self, sort_by: str = "total", row_limit: Optional[int] = None,
              max_name_width: int = 80) -> str:
        """The rows as a text table, with each row's share of the total of its kind."""
        if sort_by not in _SORT_KEYS:
            raise ValueError(f"sort_by={sort_by!r}: one of {', '.join(_SORT_KEYS)}")
        rows = sorted(self, key=_SORT_KEYS[sort_by])
        if row_limit is not None:
            rows = rows[:row_limit]
        totals = {kind: sum(a.total_us for a in self if a.kind == kind) for kind in ("task", "kernel")}
        width = min(max_name_width, max([len(a.key) for a in rows] + [4]))
        head = f"{'Name':<{width}}  {'Kind':<6} {'Calls':>7} {'Total ms':>10} {'Share':>6} " \
               f"{'Mean us':>10} {'Min us':>10} {'Max us':>10}"
        lines = [head, "-" * len(head)]
        for a in rows:
            name = a.key if len(a.key) <= width else a.key[:width - 3] + "..."
            share = a.total_us / totals[a.kind] * 100 if totals.get(a.kind) else 0.0
            lines.append(f"{name:<{width}}  {a.kind:<6} {a.count:>7} {a.total_us / 1e3:>10.3f} "
                         f"{share:>5.1f}% {a.mean_us:>10.1f} {a.min_us:>10.1f} {a.max_us:>10.1f}")
        for kind in ("task", "kernel"):
            if totals[kind]:
                lines.append(f"{kind} time: {totals[kind] / 1e3:.3f} ms")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _synchronize_all() -> None:
    # Flushes deferred recordings and waits for queued work on every chip.
    for d in range(torch.tpu.device_count()):
        torch.tpu.synchronize(d)


class profile:
    """Record what every tpu stream runs while the block runs.

    Entering synchronizes every device (so earlier work is not counted),
    then starts the recording; leaving synchronizes again (so queued and
    deferred work of the block is counted), then stops it. One recording
    at a time: entering a second raises RuntimeError.
    """

    def __init__(self) -> None:
        self._events: list[ProfilerEvent] = []
        self.dropped = 0
        self._running = False

    def start(self) -> None:
        _synchronize_all()
        _C.profiler_start()
        self._running = True

    def stop(self) -> None:
        if not self._running:
            return
        try:
            _synchronize_all()
        finally:
            self._running = False
            recording = json.loads(_C.profiler_stop())
        self.dropped = recording.get("dropped", 0)
        self._events = [
            ProfilerEvent(e["kind"], e["name"], e["thread"], e["stream"],
                          e["start_ns"] / 1e3, e["duration_ns"] / 1e3)
            for e in recording["events"]
        ]

    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def events(self) -> list[ProfilerEvent]:
        """Every event, in the order they finished."""
        return list(self._events)

    def key_averages(self, kind: Optional[str] = None) -> EventList:
        """Events summed by kind and name; `kind` ("task" or "kernel") keeps one kind."""
        if kind not in (None, "task", "kernel"):
            raise ValueError(f"kind={kind!r}: 'task', 'kernel' or None")
        sums: dict[tuple[str, str], list[float]] = {}
        for e in self._events:
            if kind is not None and e.kind != kind:
                continue
            s = sums.setdefault((e.kind, e.name), [0, 0.0, float("inf"), 0.0])
            s[0] += 1
            s[1] += e.duration_us
            s[2] = min(s[2], e.duration_us)
            s[3] = max(s[3], e.duration_us)
        rows = [EventAverage(name, k, int(c), t, lo, hi) for (k, name), (c, t, lo, hi) in sums.items()]
        return EventList(sorted(rows, key=lambda a: (-a.total_us, a.key)))

    def export_chrome_trace(self, path: str) -> None:
        """The events in the Chrome trace format (chrome://tracing, Perfetto):
        one track per thread, tasks with their stream."""
        trace = {"traceEvents": [
            {"name": e.name, "cat": e.kind, "ph": "X", "ts": e.start_us, "dur": e.duration_us,
             "pid": "tpu", "tid": e.thread or "?", "args": {"stream": e.stream}}
            for e in self._events
        ], "displayTimeUnit": "ms"}
        with open(path, "w") as f:
            json.dump(trace, f)
