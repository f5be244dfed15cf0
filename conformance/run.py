#!/usr/bin/env python3
"""Transformers' own model tests on the `tpu` device, and their pass rate.

The common test mixins (tests/test_modeling_common.py and what it imports)
come from the sdist of the installed transformers version, downloaded from
the package index into .cache/conformance/ on first use and never
committed. The per-model tester classes, and the modules the sdist lacks
(tests/generation/test_utils.py, tests/exporters/test_export.py, ...), are
ours: conformance/tests/ is laid over the sdist's tests/ before a run.

Configurations:
  native    TRANSFORMERS_TEST_DEVICE=tpu with the CPU fallback off (the headline)
  fallback  TRANSFORMERS_TEST_DEVICE=tpu with the CPU fallback on (ops counted)
  cpu       TRANSFORMERS_TEST_DEVICE=cpu, the baseline that tells device bugs from test bugs
native and fallback run on each platform asked for (host, xla); cpu once.

Each model's file runs in its own pytest process; a process that crashes or
hangs (TPURT_CONFORMANCE_TEST_TIMEOUT) costs the test it was running, which
is counted as an error, and the file is restarted after it.

Writes report.json, report.md and chart.svg into --out and appends a line to
--out/history.jsonl.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / ".cache" / "conformance"

sys.path.insert(0, str(HERE))
import report as _report  # noqa: E402

# family -> test file under tests/ (ours, in conformance/tests/models/)
MODELS = {
    "bert": "models/bert/test_modeling_bert.py",
    "roberta": "models/roberta/test_modeling_roberta.py",
    "gpt2": "models/gpt2/test_modeling_gpt2.py",
    "llama": "models/llama/test_modeling_llama.py",
    "mistral": "models/mistral/test_modeling_mistral.py",
    "qwen3": "models/qwen3/test_modeling_qwen3.py",
    "qwen3_moe": "models/qwen3_moe/test_modeling_qwen3_moe.py",
    "gemma": "models/gemma/test_modeling_gemma.py",
    "t5": "models/t5/test_modeling_t5.py",
    "bart": "models/bart/test_modeling_bart.py",
    "vit": "models/vit/test_modeling_vit.py",
    "clip": "models/clip/test_modeling_clip.py",
    "whisper": "models/whisper/test_modeling_whisper.py",
}

# The CI subset: the families whose architectures differ most (decoder with
# rotary attention, encoder, encoder-decoder, vision), native only.
QUICK_MODELS = ["llama", "bert", "t5", "vit"]
QUICK_CONFIGS = ["native"]

CONFIGS = ["native", "fallback", "cpu"]
PLATFORMS = ["host", "xla"]


def log(msg: str) -> None:
    print(msg, flush=True)


def transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def fetch_sdist(version: str) -> Path:
    """The sdist tarball of transformers==version, from the package index."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"transformers-{version}.tar.gz"
    if tarball.exists():
        return tarball
    log(f"conformance: downloading the transformers {version} sdist from the package index")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             "--no-binary", ":all:", "--no-deps", "--no-build-isolation",
             f"transformers=={version}", "-d", tmp],
            check=True,
        )
        got = Path(tmp) / tarball.name
        if not got.exists():
            raise SystemExit(f"conformance: pip download did not produce {tarball.name}")
        got.rename(tarball)
    return tarball


def prepare_tree(version: str) -> Path:
    """A fresh tests/ tree: the sdist's tests/ with conformance/tests/ laid over it."""
    tarball = fetch_sdist(version)
    # A tree of its own per run, so that runs side by side never share one.
    tree = Path(tempfile.mkdtemp(dir=CACHE, prefix=f"tree-{version}-"))
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = "tests/" + m.name[len(prefix):]
        tar.extractall(tree, members=members, filter="data")
    if not (tree / "tests" / "test_modeling_common.py").exists():
        raise SystemExit(f"conformance: {tarball.name} has no tests/test_modeling_common.py")
    overlay = HERE / "tests"
    for src in overlay.rglob("*"):
        if "__pycache__" in src.parts or src.is_dir():
            continue
        dst = tree / "tests" / src.relative_to(overlay)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    # Packages for the relative imports (from ...test_modeling_common import ...).
    for d in [tree / "tests", *(p for p in (tree / "tests").rglob("*") if p.is_dir())]:
        if d.name != "__pycache__" and not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")
    return tree


def run_env(config: str, platform: str, log_path: Path, done_path: Path, test_timeout: float, home: Path) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("TRANSFORMERS_TEST_", "TPURT_CONFORMANCE_")):
            del env[k]
    env.update(
        {
            "TRANSFORMERS_TEST_DEVICE": "cpu" if config == "cpu" else "tpu",
            "TPURT_PLATFORM": platform,
            "TPURT_CPU_FALLBACK": "1" if config == "fallback" else "0",
            "TPURT_CONFORMANCE_LOG": str(log_path),
            "TPURT_CONFORMANCE_DONE": str(done_path),
            "TPURT_CONFORMANCE_TEST_TIMEOUT": str(test_timeout),
            # Never the network: Hub-dependent tests skip at once.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # tpu registers at `import torch`
    return env


def parse_log(path: Path) -> dict:
    """collected ids, results by id, the id that started last without a result, fallback counts."""
    collected: list[str] = []
    results: dict[str, dict] = {}
    started = None
    fallback: dict[str, int] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            ev = rec.get("event")
            if ev == "collected":
                for n in rec["nodeids"]:
                    if n not in collected:
                        collected.append(n)
            elif ev == "start":
                started = rec["nodeid"]
            elif ev == "result":
                results[rec["nodeid"]] = rec
                if started == rec["nodeid"]:
                    started = None
            elif ev == "finished":
                for op, n in rec.get("fallback", {}).items():
                    fallback[op] = fallback.get(op, 0) + n
    return {"collected": collected, "results": results, "started": started, "fallback": fallback}


def run_model(tree: Path, model: str, config: str, platform: str, args, workdir: Path) -> dict:
    test_file = "tests/" + MODELS[model]
    key = f"{platform}-{config}-{model}" if config != "cpu" else f"cpu-{model}"
    workdir = workdir.resolve()  # pytest runs in the tree, not here
    log_path = workdir / f"{key}.jsonl"
    done_path = workdir / f"{key}.done"
    out_path = workdir / f"{key}.out"
    for p in (log_path, done_path, out_path):
        p.unlink(missing_ok=True)
    env = run_env(config, platform, log_path, done_path, args.test_timeout, workdir / "hf_home")
    cmd = [sys.executable, "-m", "pytest", test_file, "-p", "no:cacheprovider", "-q", "-rN",
           "--no-header", "-o", "addopts=", "--rootdir", str(tree)]
    if args.k:
        cmd += ["-k", args.k]
    crashes: list[str] = []
    t0 = time.time()
    for attempt in range(args.max_restarts + 1):
        with open(out_path, "a", encoding="utf-8") as out:
            try:
                status = subprocess.run(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        timeout=args.file_timeout).returncode
            except subprocess.TimeoutExpired:
                status = f"killed after the file timeout of {args.file_timeout:.0f} s"
        state = parse_log(log_path)
        if state["started"] is None:
            break
        # The process died in a test (crash or per-test timeout): count it,
        # then restart the file without what already has a result.
        crashed = state["started"]
        crashes.append(crashed)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": "result", "nodeid": crashed, "outcome": "error",
                                "message": f"the test process ended (exit status {status}) "
                                           "in this test: a crash or the per-test timeout"}) + "\n")
        done_path.write_text("\n".join(parse_log(log_path)["results"]) + "\n")
        log(f"    {model}: process ended in {crashed.split('::')[-1]} (exit {status}); restarting")
    state = parse_log(log_path)
    if not state["collected"]:
        tail = out_path.read_text(encoding="utf-8", errors="replace")[-2000:] if out_path.exists() else ""
        return {"model": model, "collection_error": tail, "tests": {}, "fallback": {}, "crashes": crashes,
                "seconds": round(time.time() - t0, 1)}
    tests = {}
    for n in state["collected"]:
        r = state["results"].get(n)
        if r is None:
            tests[n] = {"outcome": "error", "message": "not run: the restarts after crashes ran out"}
        else:
            tests[n] = {"outcome": r["outcome"], "message": r.get("message", "")}
    return {"model": model, "tests": tests, "fallback": state["fallback"], "crashes": crashes,
            "seconds": round(time.time() - t0, 1)}


def git_commit() -> str:
    """The commit under test, "+dirty" when the tree has uncommitted changes
    outside conformance/report/ (taken when the run starts)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!conformance/report"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if status else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"the CI subset: {', '.join(QUICK_MODELS)}, native, on every platform asked for")
    ap.add_argument("--models", help="comma-separated families (default: all, or the quick subset)")
    ap.add_argument("--configs", help=f"comma-separated among {','.join(CONFIGS)} (default: all, or native with --quick)")
    ap.add_argument("--platforms", default="host,xla", help="comma-separated among host,xla")
    ap.add_argument("-k", help="pytest -k expression, passed through")
    ap.add_argument("--out", default=str(HERE / "report"), help="report directory (default: conformance/report)")
    ap.add_argument("--test-timeout", type=float, default=300.0, help="seconds before one test counts as hung")
    ap.add_argument("--file-timeout", type=float, default=3600.0, help="seconds for one model file")
    ap.add_argument("--max-restarts", type=int, default=20, help="restarts of one file after crashes")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a native failure passes on CPU and is not in KNOWN_FAILURES.md, "
                         "or when the native run made a fallback call")
    ap.add_argument("--keep-tree", action="store_true", help="keep the assembled tests/ tree after the run")
    ap.add_argument("--fetch-only", action="store_true",
                    help="download the sdist into .cache/conformance/ and stop (scripts/setup calls this)")
    args = ap.parse_args(argv)
    if args.fetch_only:
        fetch_sdist(transformers_version())
        return 0

    models = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else list(MODELS))
    configs = args.configs.split(",") if args.configs else (QUICK_CONFIGS if args.quick else CONFIGS)
    platforms = args.platforms.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model family {m!r}; known: {', '.join(MODELS)}")
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown configuration {c!r}; known: {', '.join(CONFIGS)}")
    for p in platforms:
        if p not in PLATFORMS:
            ap.error(f"unknown platform {p!r}; known: {', '.join(PLATFORMS)}")

    version = transformers_version()
    tree = prepare_tree(version)
    try:
        return _run_all(args, models, configs, platforms, version, tree)
    finally:
        if not args.keep_tree:
            shutil.rmtree(tree, ignore_errors=True)


def _run_all(args, models, configs, platforms, version, tree) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "logs"
    workdir.mkdir(exist_ok=True)

    runs = []
    for config in configs:
        for platform in (platforms if config != "cpu" else ["-"]):
            runs.append((config, platform))
    started = time.time()
    commit = git_commit()
    results = []
    for config, platform in runs:
        label = "cpu (baseline)" if config == "cpu" else f"{platform} / {config}"
        log(f"conformance: {label}")
        per_model = []
        for m in models:
            r = run_model(tree, m, config, platform if platform != "-" else "host", args, workdir)
            c = _report.counts(r)
            rate = _report.rate(c)
            extra = f", {sum(r['fallback'].values())} fallback calls" if r["fallback"] else ""
            if "collection_error" in r:
                log(f"  {m:10s} collection failed (see {workdir}/)")
            else:
                log(f"  {m:10s} {c['passed']:4d} passed {c['failed']:3d} failed {c['errors']:3d} errors "
                    f"{c['skipped']:4d} skipped  {'-' if rate is None else f'{rate:.1%}'}  "
                    f"({r['seconds']:.0f} s{extra})")
            per_model.append(r)
        results.append({"config": config, "platform": platform, "models": per_model})

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "transformers": version,
        "quick": args.quick,
        "k": args.k,
        "seconds": round(time.time() - started, 1),
    }
    known = _report.load_known_failures(HERE / "KNOWN_FAILURES.md")
    doc = _report.build(meta, results, known)
    _report.write_all(doc, out)
    log(_report.summary_lines(doc))
    log(f"conformance: report in {out}/ (report.json, report.md, chart.svg, history.jsonl)")
    if args.check:
        problems = _report.check(doc)
        for p in problems:
            log(f"conformance check: {p}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
