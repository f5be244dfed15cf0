"""tpurt: `tpu` as a native PyTorch device, over the tpurt C ABI.

Importing this package (or just `import torch`, through the
`torch.backends` entry point) renames PyTorch's PrivateUse1 backend to
`tpu`, registers the device's kernels, allocator, streams and generators,
and installs `torch.tpu`.
"""

import atexit

import torch

from . import _C

__all__ = ["tpu"]

_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    _C._register()
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    from . import tpu as _tpu_module

    torch._register_device_module("tpu", _tpu_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    _registered = True


def _autoload() -> None:
    """Entry point of the `torch.backends` group: runs during `import torch`."""
    _register()


def _let_autograd_threads_finish() -> None:
    # torch's autograd device thread drops its last GraphTask reference (a
    # Python object decref) just after backward() returns; if the
    # interpreter is finalizing at that moment, the thread aborts the
    # process. Releasing the GIL briefly at exit lets it finish first.
    if _C.is_initialized():
        import time

        time.sleep(0.02)


_register()
atexit.register(_let_autograd_threads_finish)

from . import tpu  # noqa: E402  (after registration, as torch.tpu)


def _hook_optimizer_steps() -> None:
    """Optimizer steps as boundaries of the device's work, in each mode
    that records. Before every step, mark one (torch.tpu.mark_step): what
    was recorded before is launched, and the step's own recording runs up
    to the whole op-count limit instead of the short first flushes that
    follow an observation of the stream (under strict mode every launch
    is one).

    - Strict mode: the binding records torch's foreach loops for one fused
      launch (csrc/ops.cpp, DeferInStrict), which would otherwise start
      when the stream is next used; an optimizer step is many such loops.
      After every step, launch what it left recorded, so the update runs
      while the host goes on, as a strict launch does. (Unmarked, AdamW's
      recording after torch.compile'd steps, 507 ops on the README's
      Llama, ran as launches of 75, 150 and 282 ops, storing parameters'
      partial updates and reading them back.)
    - Defer-and-fuse: the mark keeps the step a recording of its own,
      never cut from the backward's ops by the op-count limit: AdamW's
      foreach ops then run as one loop per parameter, where a cut after
      its weight decay (on the README's Llama step it fell there) stored
      every parameter once more and read it back. After the step the
      recording goes on, by design.

    No runtime yet means no tpu tensor: a CPU model's steps start none."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    recording = (int(tpu.EagerMode.DEFER_AND_FUSE), int(tpu.EagerMode.DEFER_NEVER))

    def each_device(modes: tuple, call) -> None:
        if _C.is_initialized() and _C.eager_mode() in modes:
            for d in range(_C.device_count()):
                call(d)

    register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: each_device(recording, _C.mark_step))
    register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: each_device((int(tpu.EagerMode.DEFER_NEVER),), _C.launch_deferred))


_hook_optimizer_steps()


def _register_compiler() -> None:
    # Imported lazily by torch.compile's backend lookup would be too late
    # for backend="tpu"; dynamo's registry is light to import.
    from . import compiler  # noqa: F401


_register_compiler()


def _register_distributed() -> None:
    # The "tpurt" torch.distributed backend for device tpu (also found by
    # torch through the torch.distributed.backends entry point).
    from . import distributed

    distributed.register()


_register_distributed()
