"""The README's main job (examples/train_llama.py) runs end to end, at a
small size, and reports what it promises."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_train_llama_runs_and_reports():
    out = subprocess.run(
        [sys.executable, "examples/train_llama.py", "--steps", "4", "--cpu-steps", "2", "--batch", "2",
         "--seq", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for what in ("loss ", "step time", "torch CPU eager: ratio", "compile cache:", "peak HBM",
                 "CPU fallback calls: 0"):
        assert what in out.stdout, (what, out.stdout)
