"""The PyTorch binding under valgrind's memcheck.

    .venv/bin/python bindings/torch/valgrind/check.py

Runs workload.py (one pass through the binding's paths) in a Python under
memcheck, then reads the report. CPython and torch report errors of their
own under memcheck (uninitialised values in their allocators and
interpreter), so the check counts the errors whose first frames lie in
tpurt's code (libtpurt.so, the binding's _C extension) and the blocks
definitely lost that tpurt allocated. Both must be 0. Prints the counts.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
OURS = re.compile(r"libtpurt\.so|tpurt/_C\.|_C\.cpython-.*tpurt|tpurt_runtime::|tpurt_torch::")
ERROR_KINDS = ("Invalid ", "Conditional jump", "Use of uninitialised", "Syscall param", "Mismatched", "Source and destination", "Argument ")
TOP_FRAMES = 6


def blocks(log: str):
    """The report's records: lists of lines without the ==pid== prefix."""
    cur: list[str] = []
    for line in log.splitlines():
        m = re.match(r"==\d+== ?(.*)$", line)
        if not m:
            continue
        text = m.group(1)
        if not text.strip():
            if cur:
                yield cur
            cur = []
        else:
            cur.append(text)
    if cur:
        yield cur


def classify(log: str, show: int = 5) -> tuple[int, int, int, int]:
    """(error contexts, those in tpurt's code, definitely-lost records,
    those allocated by tpurt), printing the first `show` of ours."""
    errors = ours = leaks = ours_leaks = 0
    for b in blocks(log):
        head = b[0]
        frames = [ln for ln in b[1:] if ln.lstrip().startswith(("at ", "by "))]
        mine = False
        if head.startswith(ERROR_KINDS):
            errors += 1
            mine = any(OURS.search(f) for f in frames[:TOP_FRAMES])
            ours += mine
        elif "definitely lost" in head:
            leaks += 1
            mine = any(OURS.search(f) for f in frames)
            ours_leaks += mine
        if mine and show > 0:
            print("\n".join(b[:16]), "\n---")
            show -= 1
    return errors, ours, leaks, ours_leaks


# The classifier on a report of the form memcheck writes: one error in
# tpurt's code, one in CPython's, one leak of tpurt's.
SAMPLE = """==1== Use of uninitialised value of size 8
==1==    at 0x4A: tpurt_runtime::memory::pool::HbmPool::allocate (in /x/tpurt/libtpurt.so)
==1==    by 0x4B: PyObject_Call (in /usr/lib/libpython3.11.so)
==1==
==1== Conditional jump or move depends on uninitialised value(s)
==1==    at 0x5A: _PyObject_GC_Alloc (in /usr/lib/libpython3.11.so)
==1==
==1== 16 bytes in 1 blocks are definitely lost in loss record 3 of 9
==1==    at 0x6A: malloc (vg_replace_malloc.c:446)
==1==    by 0x6B: tpurt_torch::register_device() (in /x/tpurt/_C.cpython-311-x86_64-linux-gnu.so)
==1==
"""


def main() -> int:
    assert classify(SAMPLE, show=0) == (2, 1, 1, 1), classify(SAMPLE, show=0)
    env = dict(os.environ, PYTHONMALLOC="malloc", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    with tempfile.TemporaryDirectory() as d:
        log_path = pathlib.Path(d) / "memcheck.log"
        run = subprocess.run(
            ["valgrind", "--tool=memcheck", "--error-limit=no", "--num-callers=24", "--leak-check=full",
             "--show-leak-kinds=definite", f"--log-file={log_path}", sys.executable, str(HERE / "workload.py")],
            env=env, capture_output=True, text=True, timeout=3000,
        )
        log = log_path.read_text()
    if run.returncode != 0 or "workload done" not in run.stdout:
        print(run.stdout[-4000:], run.stderr[-4000:], log[-4000:], sep="\n")
        print("binding under memcheck: the workload failed")
        return 1
    errors, ours, leaks, ours_leaks = classify(log)
    print(f"binding under memcheck: {errors} error contexts in all, {ours} in tpurt's code; "
          f"{leaks} definitely-lost records, {ours_leaks} allocated by tpurt")
    return 1 if ours or ours_leaks else 0


if __name__ == "__main__":
    sys.exit(main())
