"""Build of the tpurt PyTorch binding: a C++ extension (torch's
cpp_extension, ninja) that includes only include/tpurt.h and links the
libtpurt built by cargo, copied beside it.

    pip install --no-build-isolation -e bindings/torch

needs `cargo build --release -p tpurt-capi --features xla` first
(scripts/setup does both)."""

import os
import shutil
import tempfile
from pathlib import Path

# The build must not load an installed tpurt (through torch's autoload of
# device backends): it replaces the library that one would have mapped.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIB = ROOT / "target" / "release" / "libtpurt.so"


class Build(BuildExtension):
    def finalize_options(self):
        super().finalize_options()
        # A build directory that outlives the call, so ninja recompiles only
        # what changed (pip's editable builds would use a fresh one).
        self.build_temp = str(HERE / "build" / "temp")

    def run(self):
        if not LIB.exists():
            raise SystemExit(
                f"{LIB} is missing: run `cargo build --release -p tpurt-capi --features xla` first"
            )
        # The library travels with the package; the extension finds it by
        # $ORIGIN. Replaced by rename, never rewritten in place: a running
        # process may have the old one mapped.
        dest = HERE / "tpurt" / "libtpurt.so"
        with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
            pass
        shutil.copy2(LIB, tmp.name)
        os.replace(tmp.name, dest)
        super().run()


setup(
    name="tpurt",
    version="0.1.0",
    description="tpu as a native PyTorch device, over the tpurt C ABI",
    packages=["tpurt"],
    package_data={"tpurt": ["libtpurt.so"]},
    ext_modules=[
        CppExtension(
            name="tpurt._C",
            sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.cpp")),
            include_dirs=[str(ROOT / "include")],
            library_dirs=[str(HERE / "tpurt")],
            libraries=["tpurt"],
            extra_compile_args=["-O2", "-std=c++20", "-Wno-unused-parameter"],
            extra_link_args=["-Wl,-rpath,$ORIGIN"],
        )
    ],
    cmdclass={"build_ext": Build},
    entry_points={
        "torch.backends": ["tpu = tpurt:_autoload"],
        "torch.distributed.backends": ["tpurt = tpurt.distributed:register"],
    },
    python_requires=">=3.10",
)
