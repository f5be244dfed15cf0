"""torch.tpu: the device module, with TorchTPU's names and torch.cuda's
memory API. Streams and events are the runtime's real ones."""

from __future__ import annotations

import contextlib
import enum
import json
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from . import _C

_DeviceLike = Union[int, str, torch.device, None]


def _index(device: _DeviceLike = None) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        return _C.current_device() if device.index is None else device.index
    raise TypeError(f"expected a device index, string or torch.device, got {type(device).__name__}")


# --- devices -----------------------------------------------------------------


def is_available() -> bool:
    try:
        return _C.device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return _C.is_initialized()


def init() -> None:
    _C.init()


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    _C.set_device(_index(device))


class device:
    """Context manager that makes `device` current."""

    def __init__(self, device: _DeviceLike):
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = _C.current_device()
        _C.set_device(self.idx)
        return self

    def __exit__(self, *exc):
        _C.set_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the tensor's device current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else _C.current_device())


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


class _DeviceProperties:
    def __init__(self, d: dict):
        self.__dict__.update(d)

    def __repr__(self) -> str:
        return (
            f"_TpuDeviceProperties(name={self.name!r}, kind={self.kind!r}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, coords={self.coords}, "
            f"host_chip={self.host_chip})"
        )


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    return _DeviceProperties(_C.device_properties(_index(device)))


def platform() -> str:
    """The runtime's platform: "host" (the emulated TPU) or "xla"."""
    return _C.platform()


def topology() -> list[int]:
    return list(_C.topology())


def slice_info() -> dict | None:
    """Where this process sits in its TPU slice, as the ``TPU_*`` variables
    describe it (``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``,
    ``TPU_CHIPS_PER_HOST_BOUNDS``, ``TPU_HOST_BOUNDS``, ``TPU_WORKER_ID``,
    ``TPU_VISIBLE_CHIPS``, ``TPU_NAME``): a dict with ``name``,
    ``accelerator_type``, ``topology``, ``chips_per_host_bounds``,
    ``host_bounds``, ``worker_id``, ``num_hosts``, ``host_chips`` and
    ``visible_chips``; None outside a slice. Each device's
    ``get_device_properties(i).coords`` is its place in the slice and
    ``.host_chip`` its index on the host."""
    return _C.slice_info()


def synchronize(device: _DeviceLike = None) -> None:
    _C.synchronize(_index(device))


def _launch_deferred(device: _DeviceLike = None) -> int:
    """Launch the ops the device's current stream holds for defer-and-fuse
    now, without waiting for them; returns how many there were."""
    return _C.launch_deferred(_index(device))


def mark_step(device: _DeviceLike = None) -> int:
    """Under defer-and-fuse, end the recording of the device's current
    stream here (every device's when `device` is None) and launch it,
    without waiting: the ops before and after a step boundary go to
    different programs, never cut elsewhere by the op-count limit. Unlike
    `synchronize` or a read, it does not make the next recordings start
    small: the next one runs up to the whole limit. An optimizer's
    `step()` marks one before it runs (in strict mode too, where its
    foreach loops are recorded), so its update of every parameter is one
    program. Returns how many ops were launched."""
    if device is None:
        return sum(_C.mark_step(d) for d in range(device_count()))
    return _C.mark_step(_index(device))


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


# --- eager modes ----------------------------------------------------------------


class EagerMode(enum.IntEnum):
    DEFER_NEVER = 0
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 1
    DEFER_AND_FUSE = 2


def eager_mode() -> EagerMode:
    return EagerMode(_C.eager_mode())


class set_eager_mode:
    """Set the eager mode; also a context manager that restores the
    previous mode on exit (for the calling thread)."""

    def __init__(self, mode: EagerMode):
        self.mode = EagerMode(mode)
        self.prev = eager_mode()
        _C.set_eager_mode(int(self.mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C.set_eager_mode(int(self.prev))
        return False


# --- precision of f32 products ----------------------------------------------------


class Precision(enum.IntEnum):
    """How f32 products (matmul, linear, attention's products, convolution)
    are computed, as XLA's precision config names it. DEFAULT: the operands
    rounded to bf16, one pass of a TPU's matrix unit (torch's "medium");
    HIGH: three bf16 passes (bf16_3x, about 16 bits of mantissa; torch's
    "high"); HIGHEST: full f32, the default (torch's "highest")."""

    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2


_TORCH_PRECISION_NAMES = {"medium": Precision.DEFAULT, "high": Precision.HIGH, "highest": Precision.HIGHEST}


def _as_precision(p: Union["Precision", str, int]) -> Precision:
    if isinstance(p, str):
        key = p.strip().lower()
        if key.upper() in Precision.__members__:
            return Precision[key.upper()]
        if key in _TORCH_PRECISION_NAMES:
            return _TORCH_PRECISION_NAMES[key]
        raise ValueError(
            f"precision {p!r}: use torch.tpu.Precision.DEFAULT, HIGH or HIGHEST "
            "(or torch's names 'medium', 'high', 'highest')"
        )
    if isinstance(p, bool) or not isinstance(p, int):
        raise TypeError(f"precision must be a torch.tpu.Precision or its name, not {type(p).__name__}")
    try:
        return Precision(p)
    except ValueError:
        raise ValueError(f"precision {p}: use torch.tpu.Precision.DEFAULT (0), HIGH (1) or HIGHEST (2)") from None


def get_precision() -> Precision:
    """The precision of f32 products in force on the calling thread (set by
    `precision`, or torch's float32 matmul precision)."""
    return Precision(_C.matmul_precision())


class precision:
    """Set the precision of f32 products on tpu (a `Precision`, its name,
    or torch's "medium"/"high"/"highest"); also a context manager that
    restores the previous one on exit. An op takes the precision in force
    when it is called (a deferred op keeps it until it runs). The host
    platform rounds the operands as a TPU's matrix unit does, so it shows
    the numbers a TPU would give; on xla, XLA's precision config (the XLA
    CPU plugin computes f32 in full regardless).

    Until it is set, the precision follows torch's
    ``torch.set_float32_matmul_precision`` ("highest": HIGHEST, "high":
    HIGH, "medium": DEFAULT, as its documentation describes them);
    ``precision(None)`` follows torch's again."""

    def __init__(self, value: Union[Precision, str, int, None]):
        self.value = None if value is None else _as_precision(value)
        self.prev = None if _C.matmul_precision_follows_torch() else get_precision()
        _C.set_matmul_precision(None if self.value is None else int(self.value))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C.set_matmul_precision(None if self.prev is None else int(self.prev))
        return False


def allow_excess_precision(enabled: bool = True):
    """Let XLA keep bf16 and f16 intermediates of a fused program at f32
    instead of rounding them where the program does (XLA's
    ``xla_allow_excess_precision``): faster on a TPU, and more precise,
    but no longer equal to torch's results, which round after every op.
    Off by default. A setter and a context manager
    (`torch.tpu.compiler.custom_compiler_options`); the host ignores it."""
    return compiler.custom_compiler_options({"xla_allow_excess_precision": bool(enabled)})


# --- streams and events ------------------------------------------------------------


class Stream(torch.Stream):
    """A tpu stream: in-order work on one device's TensorCore (or, with
    `core="sparse"`, its SparseCore queue)."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, core: str = "tensor", **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        if core not in ("tensor", "sparse"):
            raise ValueError(f'core must be "tensor" or "sparse", got {core!r}')
        sid, idx, dtype = _C.new_stream(_index(device), priority, core == "sparse")
        return super().__new__(cls, stream_id=sid, device_index=idx, device_type=dtype)

    def __init__(self, *args, **kwargs):
        pass

    @property
    def core(self) -> str:
        return _C.stream_core(self.stream_id, self.device_index)[1]

    @property
    def priority(self) -> int:
        return _C.stream_core(self.stream_id, self.device_index)[0]

    def reset(self) -> None:
        """Clear a failed stream's error so it can be used again."""
        _C.stream_reset(self.stream_id, self.device_index)


def _wrap(t) -> Stream:
    sid, idx, dtype = t
    return Stream(stream_id=sid, device_index=idx, device_type=dtype)


def current_stream(device: _DeviceLike = None) -> Stream:
    return _wrap(_C.current_stream(_index(device)))


def default_stream(device: _DeviceLike = None) -> Stream:
    return _wrap(_C.default_stream(_index(device)))


def set_stream(stream: torch.Stream) -> None:
    _C.set_stream(stream.stream_id, stream.device_index)


@contextlib.contextmanager
def stream(s: Optional[torch.Stream]) -> Iterator[Optional[torch.Stream]]:
    """Make `s` the current stream of its device inside the block."""
    if s is None:
        yield None
        return
    prev = current_stream(s.device_index)
    prev_device = _C.current_device()
    _C.set_device(s.device_index)
    _C.set_stream(s.stream_id, s.device_index)
    try:
        yield s
    finally:
        _C.set_stream(prev.stream_id, prev.device_index)
        _C.set_device(prev_device)


class Event:
    """A tpu event (a `torch.Event` on device tpu); timing is always
    available (`elapsed_time`)."""

    def __new__(cls, enable_timing: bool = True, blocking: bool = False, interprocess: bool = False):
        return torch.Event(device="tpu", enable_timing=True, blocking=blocking, interprocess=interprocess)


# --- RNG ----------------------------------------------------------------------------


def _generators() -> list[torch.Generator]:
    return [_C.default_generator(i) for i in range(device_count())]


default_generators = property(lambda self: tuple(_generators()))


def manual_seed(seed: int) -> None:
    _C.default_generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _C.default_generator(current_device()).seed()


def seed_all() -> None:
    for g in _generators():
        g.seed()


def initial_seed() -> int:
    return _C.default_generator(current_device()).initial_seed()


def get_rng_state(device: _DeviceLike = "tpu") -> torch.Tensor:
    return _C.default_generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "tpu") -> None:
    _C.default_generator(_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state_all(states) -> None:
    for g, s in zip(_generators(), states):
        g.set_state(s)


# --- memory (torch.cuda's names) ------------------------------------------------------


def memory_stats(device: _DeviceLike = None) -> dict[str, Any]:
    """Flat statistics in torch.cuda.memory_stats's naming, and
    `plugin_bytes.all.*`: what a PJRT plugin holds during executions on
    the xla platform (inputs copied in where XLA cannot read the pool's
    memory, results before they are copied out, the programs'
    temporaries; not part of the reserved bytes)."""
    raw = _C.memory_stats(_index(device))
    out: dict[str, Any] = {}
    for key in (
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "requested_bytes",
        "plugin_bytes",
    ):
        for field, value in raw[key].items():
            out[f"{key}.all.{field}"] = value
    for key in (
        "num_alloc",
        "num_free",
        "num_ooms",
        "num_alloc_retries",
        "num_segment_allocs",
        "num_segment_frees",
    ):
        out[key] = raw[key]
    out["segment.all.current"] = raw["num_segments"]
    out["segment.all.peak"] = raw["peak_num_segments"]
    out["capacity_bytes"] = raw["capacity_bytes"]
    return dict(sorted(out.items()))


def handle_counts() -> dict[str, int]:
    """Live C ABI handles of the process by kind (runtimes, streams,
    events, buffers, executables): flat in a healthy long run."""
    return dict(_C.handle_counts())


def memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes"]["current"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["allocated_bytes"]["peak"]


def memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes"]["current"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    for i in range(device_count()):
        _C.empty_cache(i)


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes: total is the HBM capacity, free what neither
    the pool has reserved nor a PJRT plugin holds in buffers of its own."""
    raw = _C.memory_stats(_index(device))
    total = raw["capacity_bytes"]
    used = raw["reserved_bytes"]["current"] + raw["plugin_bytes"]["current"]
    return max(total - used, 0), total


def memory_snapshot(device: _DeviceLike = None) -> dict[str, Any]:
    return json.loads(_C.memory_snapshot(_index(device)))


def memory_summary(device: _DeviceLike = None) -> str:
    s = memory_stats(device)
    mib = 1 << 20
    return (
        f"tpu:{_index(device)} allocated {s['allocated_bytes.all.current'] / mib:.1f} MiB "
        f"(peak {s['allocated_bytes.all.peak'] / mib:.1f}), reserved "
        f"{s['reserved_bytes.all.current'] / mib:.1f} MiB (peak {s['reserved_bytes.all.peak'] / mib:.1f}), "
        f"capacity {s['capacity_bytes'] / mib:.0f} MiB"
        + (
            f", plugin buffers {s['plugin_bytes.all.current'] / mib:.1f} MiB "
            f"(peak {s['plugin_bytes.all.peak'] / mib:.1f})"
            if s["plugin_bytes.all.peak"]
            else ""
        )
    )


# --- the CPU fallback -----------------------------------------------------------------


def enable_cpu_fallback(enabled: bool = True) -> None:
    """Run aten ops without a tpu kernel on the CPU (counted); off, they
    raise NotImplementedError naming the op."""
    _C.set_cpu_fallback_enabled(bool(enabled))


def cpu_fallback_enabled() -> bool:
    return _C.cpu_fallback_enabled()


def fallback_stats() -> dict[str, int]:
    """Calls per aten op that ran on the CPU fallback."""
    return dict(_C.fallback_counts())


def reset_fallback_stats() -> None:
    _C.reset_fallback_counts()


# --- the compile cache ----------------------------------------------------------------


def compile_cache_stats() -> dict[str, Any]:
    return dict(_C.cache_stats())


def compile_cache_clear(memory: bool = True, disk: bool = False) -> None:
    _C.cache_clear(memory, disk)


def set_compile_cache_only(on: bool) -> None:
    """When on, a compile-cache miss is an error naming the graph."""
    _C.cache_only(bool(on))


def set_dump_on_miss(directory: Optional[str]) -> None:
    _C.dump_on_miss(directory)


def set_shape_buckets(buckets: Union[None, str, int, Sequence[int]] = "pow2") -> None:
    """How torch.compile(backend="tpu") pads a dynamic dimension: "pow2"
    (powers of two from 8, the default), an int (powers of two from it), a
    list of sizes (each size goes to the first at or above it; beyond the
    last, to its multiples), or None (no padding: every size its own
    program). `TPURT_SHAPE_BUCKETS` sets it at start-up."""
    if buckets is None:
        _C.set_shape_buckets(0, [])
    elif isinstance(buckets, str):
        if buckets != "pow2":
            raise ValueError(f"shape buckets {buckets!r}: expected 'pow2', an int, a list of sizes or None")
        _C.set_shape_buckets(1, [])
    elif isinstance(buckets, int) and not isinstance(buckets, bool):
        if buckets < 1:
            raise ValueError(f"shape bucket minimum {buckets}: must be at least 1")
        _C.set_shape_buckets(1, [buckets])
    else:
        try:
            sizes = list(buckets)
        except TypeError:
            raise ValueError(f"shape buckets {buckets!r}: expected 'pow2', an int, a list of sizes or None") from None
        if not sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes):
            raise ValueError(f"shape buckets {buckets!r}: a list of sizes needs whole numbers of at least 1")
        _C.set_shape_buckets(2, sizes)


def shape_bucket(n: int) -> int:
    """The size a dynamic dimension of size `n` is padded up to."""
    if n < 0:
        raise ValueError(f"shape_bucket: size {n} is negative")
    return int(_C.shape_bucket(int(n)))


_allow_cache = True


def _cache_requests() -> int:
    return _C.cache_stats()["requests"]


def _cache_hits() -> int:
    return _C.cache_stats()["hits"]


def _cache_misses() -> int:
    return _C.cache_stats()["misses"]


def _is_in_bad_fork() -> bool:
    """Whether this process forked after the runtime started (its threads
    did not come along); torch.random asks before seeding."""
    return _C.is_in_bad_fork()


# --- attention ------------------------------------------------------------------------


def set_fused_attention(enabled: bool) -> None:
    """scaled_dot_product_attention on tpu: the runtime's attention op (one
    op forward, one backward) when on (the default), torch's math
    decomposition over the native kernels when off.
    `TPURT_FUSED_ATTENTION=0` starts with it off."""
    _C.set_fused_attention_enabled(bool(enabled))


def fused_attention_enabled() -> bool:
    return _C.fused_attention_enabled()


# --- ops ------------------------------------------------------------------------------

from . import ops  # noqa: E402  (torch.tpu.ops: the SparseCore embedding ops)
from . import profiler  # noqa: E402  (torch.tpu.profiler: device time per task and kernel)
from . import distributed  # noqa: E402  (torch.tpu.distributed: the "tpurt" c10d backend)
from . import optimizers  # noqa: E402  (torch.tpu.optimizers: AdamW, Sgd, Muon, a program a step)
from .distributed import topology_aware_mesh  # noqa: E402,F401  (a DeviceMesh laid out by the chips)
from . import compiler  # noqa: E402  (torch.tpu.compiler: the dynamo backend, compiler options)


def _install_submodules() -> None:
    # torch._register_device_module makes this module `torch.tpu` in
    # sys.modules, but a plain module: `import torch.tpu.profiler` or
    # `from torch.tpu.ops import sparse_dense_matmul` (TorchTPU's
    # spellings: its torch.tpu is a package) failed with "'torch.tpu' is
    # not a package". The submodules are named there as well, and an empty
    # __path__ makes this module a package that finds nothing more on disk.
    import sys

    me = sys.modules[__name__]
    if not hasattr(me, "__path__"):
        me.__path__ = []
    for name in ("ops", "profiler", "distributed", "optimizers", "compiler"):
        sys.modules[f"torch.tpu.{name}"] = getattr(me, name)


_install_submodules()
