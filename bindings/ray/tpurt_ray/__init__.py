"""TPU slices as Ray actors on tpurt (bindings/ray).

A slice is a gang of host actors, one per TPU host, placed by Ray's own
TPU support (``ray.util.tpu.SlicePlacementGroup``); each actor owns its
host's chips through the tpurt runtime, which honours ``TPU_VISIBLE_CHIPS``
and the slice topology variables on every platform.
"""

from .host import HostContext, SliceHost
from .slice import HostFailed, HostHealth, SliceError, SliceHealth, TpuSlice
from .topology import SliceShape, slice_shape

__all__ = [
    "HostContext",
    "HostFailed",
    "HostHealth",
    "SliceError",
    "SliceHealth",
    "SliceHost",
    "SliceShape",
    "TpuSlice",
    "slice_shape",
]
