"""The conformance harness itself: counting, the known-failures table, and
surviving crashes and hangs (run by `make test`; no transformers sdist
needed)."""

import argparse
import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import report  # noqa: E402
import run  # noqa: E402

FAKE_TESTS = '''
import os, signal, time, unittest

class FakeModelTest(unittest.TestCase):
    def test_a_passes(self):
        pass

    def test_b_crashes(self):
        os.kill(os.getpid(), signal.SIGSEGV)

    def test_c_fails(self):
        self.assertEqual(1, 2)

    def test_d_hangs(self):
        time.sleep(60)

    def test_e_skips(self):
        self.skipTest("not here")

    def test_f_passes(self):
        pass

    def test_g_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    def test_h_subtest_skips(self):
        for i in range(2):
            with self.subTest(i=i):
                if i == 0:
                    self.skipTest("this class has nothing to check")
'''


def test_counts_rate_and_known_failures(tmp_path):
    result = {"tests": {
        "a": {"outcome": "passed"}, "b": {"outcome": "failed"}, "c": {"outcome": "error"},
        "d": {"outcome": "skipped"}, "e": {"outcome": "xfailed"}, "f": {"outcome": "xpassed"},
    }}
    c = report.counts(result)
    assert c == {"passed": 2, "failed": 1, "errors": 1, "skipped": 2, "collected": 6}
    assert report.rate(c) == 0.5
    assert report.rate({"passed": 0, "failed": 0, "errors": 0}) is None

    known_md = tmp_path / "KNOWN.md"
    known_md.write_text(
        "| test | platforms | cause |\n| --- | --- | --- |\n"
        "| `tests/models/x/*::XTest::test_b` | xla | a cause |\n"
        "| `*::test_c` | all | another |\n"
    )
    known = report.load_known_failures(known_md)
    assert len(known) == 2
    results = [
        {"config": "cpu", "platform": "-", "models": [{"model": "x", "tests": {
            "tests/models/x/t.py::XTest::test_b": {"outcome": "passed"},
            "tests/models/x/t.py::XTest::test_c": {"outcome": "passed"},
            "tests/models/x/t.py::XTest::test_d": {"outcome": "failed"}}}]},
        {"config": "native", "platform": "host", "models": [{"model": "x", "fallback": {}, "tests": {
            "tests/models/x/t.py::XTest::test_b": {"outcome": "failed", "message": "E boom"},
            "tests/models/x/t.py::XTest::test_c": {"outcome": "error",
                                                   "message": "tpu: erfinv has no tpu kernel and ..."},
            "tests/models/x/t.py::XTest::test_d": {"outcome": "failed"}}}]},
    ]
    doc = report.build({"date": "d", "commit": "c", "transformers": "v", "quick": True, "seconds": 1.0},
                       results, known)
    native = doc["runs"][1]
    assert native["overall"]["pass_rate"] == 0.0
    assert native["missing_kernels"] == {"erfinv": 1}
    by_id = {f["nodeid"].split("::")[-1]: f for f in native["failures"]}
    assert by_id["test_b"]["known"] is None  # known on xla only
    assert by_id["test_c"]["known"] == "another"
    assert by_id["test_d"]["cpu"] == "failed"
    problems = report.check(doc)
    # test_b: a device bug nobody explained; test_c is known; test_d fails on CPU too.
    assert len(problems) == 1 and "test_b" in problems[0]
    md = report.to_markdown(doc)
    assert "| host / native |" in md and "`erfinv`" in md
    assert report.to_svg(doc).startswith("<svg")


def test_the_known_failures_file_parses():
    path = HERE / "KNOWN_FAILURES.md"
    rows = report.load_known_failures(path)
    text = path.read_text()
    # Every table row that names a test pattern is read, with a cause.
    assert len(rows) == text.count("\n| `")
    for row in rows:
        assert row["cause"], row
        assert set(row["platforms"]) <= {"host", "xla", "all"}, row


def test_a_crash_and_a_hang_cost_one_test_each(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "tests" / "models" / "fake").mkdir(parents=True)
    shutil.copyfile(HERE / "tests" / "conftest.py", tree / "tests" / "conftest.py")
    (tree / "tests" / "models" / "fake" / "test_modeling_fake.py").write_text(FAKE_TESTS)
    monkeypatch.setitem(run.MODELS, "fake", "models/fake/test_modeling_fake.py")
    args = argparse.Namespace(k=None, test_timeout=3.0, file_timeout=120.0, max_restarts=5)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    r = run.run_model(tree, "fake", "cpu", "host", args, Path("work"))  # relative, as --out may be
    outcomes = {n.split("::")[-1]: t["outcome"] for n, t in r["tests"].items()}
    assert outcomes == {
        "test_a_passes": "passed",
        "test_b_crashes": "error",
        "test_c_fails": "failed",
        "test_d_hangs": "error",
        "test_e_skips": "skipped",
        "test_f_passes": "passed",
        "test_g_subtest_fails": "failed",
        "test_h_subtest_skips": "passed",
    }
    assert [c.split("::")[-1] for c in r["crashes"]] == ["test_b_crashes", "test_d_hangs"]
    assert "process ended" in r["tests"][next(n for n in r["tests"] if n.endswith("test_b_crashes"))]["message"]


@pytest.mark.skipif(os.environ.get("TPURT_CONFORMANCE_SLOW") != "1", reason="needs the sdist download")
def test_prepare_tree_lays_ours_over_the_sdist():
    tree = run.prepare_tree(run.transformers_version())
    assert (tree / "tests" / "test_modeling_common.py").exists()
    assert (tree / "tests" / "generation" / "test_utils.py").read_text() == \
        (HERE / "tests" / "generation" / "test_utils.py").read_text()
