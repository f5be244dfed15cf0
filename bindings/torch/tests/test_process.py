"""Process-level behaviour: settings read at start-up, and fork safety."""

import os
import subprocess
import sys

import pytest
import torch


def run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=300)


def test_fallback_off_from_the_environment():
    out = run(
        "import torch\n"
        "assert not torch.tpu.cpu_fallback_enabled()\n"
        "try:\n"
        "    torch.special.airy_ai(torch.zeros(2, device='tpu'))\n"
        "except NotImplementedError as e:\n"
        "    print('raised:', e)\n",
        TPURT_CPU_FALLBACK="0",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised:" in out.stdout and "airy_ai" in out.stdout


def test_import_torch_alone_registers_tpu():
    out = run("import torch; print(torch.ones(2, device='tpu').device, torch.tpu.device_count())")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["tpu:0", "4"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_start_gets_a_clear_error():
    torch.ones(1, device="tpu")  # the runtime is up in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: using tpu must fail with a message, not hang
        os.close(r)
        try:
            torch.ones(1, device="tpu").cpu()
            msg = b"no error"
        except RuntimeError as e:
            msg = str(e).encode()[:500]
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    msg = os.read(r, 1000).decode()
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert "forked" in msg and "spawn" in msg, msg
