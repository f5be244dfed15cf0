"""The conformance report: counts, pass rates, JSON, Markdown, an SVG chart
and the history file. Used by run.py; plain Python, no plotting library.

pass rate = passed / (passed + failed + errors); skipped tests (and
expected failures) are reported but not in the rate.
"""

from __future__ import annotations

import fnmatch
import json
import re
from html import escape
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")
_NO_KERNEL = re.compile(r"tpu: (\S+) has no tpu kernel")


def counts(model_result: dict) -> dict:
    c = {k: 0 for k in OUTCOMES}
    for t in model_result.get("tests", {}).values():
        o = t["outcome"]
        if o in ("passed", "xpassed"):
            c["passed"] += 1
        elif o == "failed":
            c["failed"] += 1
        elif o == "error":
            c["errors"] += 1
        else:  # skipped, xfailed
            c["skipped"] += 1
    if "collection_error" in model_result:
        c["errors"] += 1
    c["collected"] = len(model_result.get("tests", {}))
    return c


def rate(c: dict):
    n = c["passed"] + c["failed"] + c["errors"]
    return None if n == 0 else c["passed"] / n


def load_known_failures(path: Path) -> list[dict]:
    """Rows of KNOWN_FAILURES.md's tables: | `pattern` | platforms | cause |.

    pattern is an fnmatch pattern over test ids (tests/models/...::Class::test);
    platforms is `host`, `xla` or `all`.
    """
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        pattern = cells[0].strip("`")
        platforms = [p.strip().strip("`") for p in cells[1].split(",")]
        rows.append({"pattern": pattern, "platforms": platforms, "cause": cells[2]})
    return rows


def _known(known: list[dict], nodeid: str, platform: str):
    for row in known:
        if ("all" in row["platforms"] or platform in row["platforms"]) and fnmatch.fnmatchcase(nodeid, row["pattern"]):
            return row["cause"]
    return None


def build(meta: dict, results: list[dict], known: list[dict]) -> dict:
    cpu_outcome: dict[str, str] = {}
    for run in results:
        if run["config"] == "cpu":
            for m in run["models"]:
                for n, t in m.get("tests", {}).items():
                    cpu_outcome[n] = t["outcome"]
    runs = []
    for run in results:
        total = {k: 0 for k in (*OUTCOMES, "collected")}
        models = {}
        histogram: dict[str, int] = {}
        refused: dict[str, int] = {}
        failures = []
        for m in run["models"]:
            c = counts(m)
            for k in total:
                total[k] += c[k]
            calls = sum(m.get("fallback", {}).values())
            models[m["model"]] = {**c, "pass_rate": rate(c), "seconds": m.get("seconds"),
                                  "crashes": len(m.get("crashes", [])), "fallback_calls": calls}
            if "collection_error" in m:
                models[m["model"]]["collection_error"] = m["collection_error"]
            for op, n in m.get("fallback", {}).items():
                histogram[op] = histogram.get(op, 0) + n
            for n, t in m.get("tests", {}).items():
                if t["outcome"] not in ("failed", "error"):
                    continue
                for op in _NO_KERNEL.findall(t.get("message", "")):
                    refused[op] = refused.get(op, 0) + 1
                on_cpu = cpu_outcome.get(n)
                failures.append({
                    "nodeid": n,
                    "outcome": t["outcome"],
                    "message": t.get("message", ""),
                    "cpu": on_cpu,
                    "known": None if run["config"] == "cpu" else _known(known, n, run["platform"]),
                })
        runs.append({
            "config": run["config"],
            "platform": run["platform"],
            "overall": {**total, "pass_rate": rate(total)},
            "models": models,
            "fallback_histogram": dict(sorted(histogram.items(), key=lambda kv: -kv[1])),
            "missing_kernels": dict(sorted(refused.items(), key=lambda kv: -kv[1])),
            "failures": failures,
        })
    return {**meta, "runs": runs}


def _label(run: dict) -> str:
    return "cpu (baseline)" if run["config"] == "cpu" else f"{run['platform']} / {run['config']}"


def _pct(x) -> str:
    """One decimal, or two where one would round a rate below 100% up to it."""
    if x is None:
        return "-"
    if x < 1 and round(100 * x, 1) >= 100.0:
        return f"{100 * x:.2f}%"
    return f"{100 * x:.1f}%"


def to_markdown(doc: dict) -> str:
    out = ["# Transformers conformance on `tpu`\n",
           f"transformers {doc['transformers']} (tests from its sdist), commit {doc['commit']}, "
           f"{doc['date']}, {'quick subset' if doc['quick'] else 'full run'}"
           f"{', -k ' + doc['k'] if doc.get('k') else ''}, {doc['seconds']:.0f} s.\n",
           "pass rate = passed / (passed + failed + errors). *native*: the CPU fallback off; "
           "*fallback*: on; *cpu*: the plain CPU device, the baseline.\n",
           "The common mixins (`tests/test_modeling_common.py` and what it imports) are the sdist's. "
           "The sdist lacks `tests/generation/test_utils.py` and `tests/exporters/test_export.py`, which "
           "the mixins import: ours stand in their place, and they are real checks, not stubs "
           "(`GenerationTesterMixin` runs `generate()` on the device against the CPU: greedy with and "
           "without the KV cache, static cache, sampling, beam search, dict outputs, left padding, "
           "`inputs_embeds`; `ExportTesterMixin` round-trips `torch.export`). Their tests are counted "
           "with the rest. The per-model testers are ours too (conformance/tests/models/).\n",
           "## Overall\n",
           "| run | collected | passed | failed | errors | skipped | pass rate | fallback calls |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in doc["runs"]:
        o = run["overall"]
        calls = sum(run["fallback_histogram"].values())
        out.append(f"| {_label(run)} | {o['collected']} | {o['passed']} | {o['failed']} | {o['errors']} | "
                   f"{o['skipped']} | {_pct(o['pass_rate'])} | {calls if run['config'] != 'cpu' else '-'} |")
    out.append("\n## Per model\n")
    models = list(doc["runs"][0]["models"]) if doc["runs"] else []
    out.append("| model | " + " | ".join(_label(r) for r in doc["runs"]) + " |")
    out.append("| --- |" + " ---: |" * len(doc["runs"]))
    for m in models:
        cells = []
        for r in doc["runs"]:
            s = r["models"].get(m)
            if s is None:
                cells.append("")
            else:
                cells.append(f"{_pct(s['pass_rate'])} ({s['passed']}/{s['passed'] + s['failed'] + s['errors']}, "
                             f"{s['skipped']} skipped)")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    for run in doc["runs"]:
        if run["fallback_histogram"]:
            out.append(f"\n## Ops on the CPU fallback ({_label(run)})\n")
            out.append("| op | calls |\n| --- | ---: |")
            for op, n in run["fallback_histogram"].items():
                out.append(f"| `{op}` | {n} |")
        elif run["config"] == "fallback":
            out.append(f"\n## Ops on the CPU fallback ({_label(run)})\n")
            out.append("None: with the fallback on, no test called it (every op the tests reached ran on a "
                       "tpu kernel).")
        if run["missing_kernels"]:
            out.append(f"\n## Ops without a tpu kernel that failed tests ({_label(run)})\n")
            out.append("| op | tests |\n| --- | ---: |")
            for op, n in run["missing_kernels"].items():
                out.append(f"| `{op}` | {n} |")
    for run in doc["runs"]:
        if not run["failures"]:
            continue
        out.append(f"\n## Failures and errors ({_label(run)})\n")
        out.append("| test | outcome | on cpu | known cause | message |")
        out.append("| --- | --- | --- | --- | --- |")
        for f in run["failures"]:
            msg = " ".join(f["message"].split())[:200].replace("|", "\\|")
            known = (f["known"] or "").replace("|", "\\|")
            out.append(f"| `{f['nodeid']}` | {f['outcome']} | {f['cpu'] or '-'} | {known} | {msg} |")
    return "\n".join(out) + "\n"


def to_svg(doc: dict) -> str:
    runs = doc["runs"]
    models = list(runs[0]["models"]) if runs else []
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    bar, gap, left, top, height = 12, 18, 50, 40, 220
    group = bar * max(1, len(runs)) + gap
    width = left + group * max(1, len(models)) + 20
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="13">Transformers conformance on tpu: pass rate per model '
           f'(transformers {escape(doc["transformers"])}, {escape(doc["commit"])})</text>']
    for pct in (0, 25, 50, 75, 100):
        y = top + height - height * pct / 100
        svg.append(f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{pct}%</text>')
    for i, m in enumerate(models):
        x0 = left + i * group + gap / 2
        for j, r in enumerate(runs):
            s = r["models"].get(m)
            v = (s or {}).get("pass_rate")
            h = 0 if v is None else height * v
            svg.append(f'<rect x="{x0 + j * bar}" y="{top + height - h}" width="{bar - 1}" height="{h}" '
                       f'fill="{colors[j % len(colors)]}"><title>{escape(m)} {escape(_label(r))}: '
                       f'{_pct(v)}</title></rect>')
        svg.append(f'<text x="{x0 + bar * len(runs) / 2}" y="{top + height + 14}" text-anchor="middle">'
                   f'{escape(m)}</text>')
    for j, r in enumerate(runs):
        y = top + height + 34 + 14 * (j // 3)
        x = left + 200 * (j % 3)
        svg.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colors[j % len(colors)]}"/>')
        svg.append(f'<text x="{x + 14}" y="{y}">{escape(_label(r))}: {_pct(r["overall"]["pass_rate"])}</text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def history_line(doc: dict) -> dict:
    return {
        "date": doc["date"], "commit": doc["commit"], "transformers": doc["transformers"],
        "quick": doc["quick"], "k": doc.get("k"), "seconds": doc["seconds"],
        "runs": [{"config": r["config"], "platform": r["platform"], **r["overall"],
                  "fallback_calls": sum(r["fallback_histogram"].values())} for r in doc["runs"]],
    }


def write_all(doc: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (out / "report.md").write_text(to_markdown(doc), encoding="utf-8")
    (out / "chart.svg").write_text(to_svg(doc), encoding="utf-8")
    with open(out / "history.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(history_line(doc)) + "\n")


def summary_lines(doc: dict) -> str:
    lines = ["conformance summary:"]
    for r in doc["runs"]:
        o = r["overall"]
        lines.append(f"  {_label(r):18s} {o['passed']} passed, {o['failed']} failed, {o['errors']} errors, "
                     f"{o['skipped']} skipped of {o['collected']}: {_pct(o['pass_rate'])}")
    return "\n".join(lines)


def check(doc: dict) -> list[str]:
    """What --check refuses: device bugs not in KNOWN_FAILURES.md, fallback calls in a native run."""
    problems = []
    for r in doc["runs"]:
        if r["config"] == "cpu":
            continue
        if r["config"] == "native" and r["fallback_histogram"]:
            problems.append(f"{_label(r)} made fallback calls: {r['fallback_histogram']}")
        for m, s in r["models"].items():
            if "collection_error" in s:
                problems.append(f"{_label(r)}: {m} failed to collect")
        for f in r["failures"]:
            if f["known"] is None and f["cpu"] != "failed" and f["cpu"] != "error":
                problems.append(f"{_label(r)}: {f['nodeid']} {f['outcome']} and is not in KNOWN_FAILURES.md: "
                                f"{' '.join(f['message'].split())[:300]}")
    return problems
