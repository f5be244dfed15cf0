"""pytest plugin for the conformance run (laid over the sdist's tests/).

It is what lets conformance/run.py count results that survive a crash:

- every collected test, every test started and every result is appended,
  flushed, to the JSON-lines file named by TPURT_CONFORMANCE_LOG, so a
  process that dies in the middle of a test leaves a log saying which one;
- tests listed in TPURT_CONFORMANCE_DONE (one node id per line) are
  deselected, so the runner can restart a crashed file where it stopped;
- a test that runs longer than TPURT_CONFORMANCE_TEST_TIMEOUT seconds
  makes faulthandler dump every thread's stack and end the process (a hang
  becomes a counted error, not a stuck nightly job);
- at the end of the session the CPU fallback's per-op counts
  (torch.tpu.fallback_stats()) go into the log.
"""

import faulthandler
import json
import os
import re
import sys
import time


_LOG = os.environ.get("TPURT_CONFORMANCE_LOG")
_TIMEOUT = float(os.environ.get("TPURT_CONFORMANCE_TEST_TIMEOUT", "0") or 0)
_final: dict[str, str] = {}
_messages: dict[str, str] = {}


def _write(record: dict) -> None:
    if not _LOG:
        return
    with open(_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pytest_configure(config):
    for name in (
        "flash_attn_test",
        "flash_attn_3_test",
        "torch_compile_test",
        "torch_export_test",
        "generate",
        "is_training_test",
        "is_tensor_parallel_test",
        "is_pipeline_test",
        "is_staging_test",
        "accelerate_tests",
        "not_device_test",
        "slow",
    ):
        config.addinivalue_line("markers", f"{name}: transformers' test marker")


def pytest_collection_modifyitems(session, config, items):
    done_file = os.environ.get("TPURT_CONFORMANCE_DONE")
    if done_file and os.path.exists(done_file):
        with open(done_file, encoding="utf-8") as f:
            done = {line.strip() for line in f if line.strip()}
        keep = [item for item in items if item.nodeid not in done]
        deselected = [item for item in items if item.nodeid in done]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = keep


def pytest_collection_finish(session):
    # After every deselection (-k included): what this process will run.
    _write({"event": "collected", "nodeids": [item.nodeid for item in session.items]})


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid, "t": time.time()})
    if _TIMEOUT > 0:
        faulthandler.dump_traceback_later(_TIMEOUT, exit=True, file=sys.stderr)


_EXC = re.compile(r"^E\s+([\w.]+(Error|Exception|Exit|Interrupt)|AssertionError|NotImplementedError)\b")


def _short(report) -> str:
    """The exception line pytest marks with `E` (and the next two), else the last lines."""
    text = str(report.longrepr) if report.longrepr is not None else ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:600]
    lines = [line for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _EXC.match(line)]
    pick = lines[starts[-1]:starts[-1] + 3] if starts else lines[-3:]
    return "\n".join(line.strip() for line in pick)[:600]


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if hasattr(report, "context") and not report.failed:
        # A subtest (unittest's subTest) that passed or skipped: the test's
        # own report decides, as pytest's summary does. A failed one fails
        # the test (below).
        return
    if report.when == "setup":
        _final.pop(nodeid, None)
    outcome = _final.get(nodeid)
    if report.failed:
        if report.when == "call":
            outcome = "failed"
        elif outcome != "failed":
            outcome = "error"
        _messages[nodeid] = _short(report)
    elif report.skipped:
        if hasattr(report, "wasxfail"):
            outcome = outcome or "xfailed"
        else:
            outcome = outcome or "skipped"
        _messages.setdefault(nodeid, _short(report))
    elif report.when == "call" and outcome is None:
        # A failed subtest (unittest's subTest) reported earlier in this
        # call phase keeps the test failed; the test's own passing report
        # comes after it.
        outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
    _final[nodeid] = outcome
    if report.when == "teardown":
        if _TIMEOUT > 0:
            faulthandler.cancel_dump_traceback_later()
        _write(
            {
                "event": "result",
                "nodeid": nodeid,
                "outcome": outcome or "passed",
                "message": _messages.pop(nodeid, ""),
                "t": time.time(),
            }
        )
        _final.pop(nodeid, None)


def pytest_sessionfinish(session, exitstatus):
    stats = {}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "tpu") and hasattr(torch.tpu, "fallback_stats"):
        stats = torch.tpu.fallback_stats()
    _write({"event": "finished", "fallback": stats})
