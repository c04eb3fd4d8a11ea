"""``make bench``: run every script in bench/ and write docs/BENCHMARKS.md, its summary
table first. ``run_all.py SCRIPT...`` (``make bench ONLY=...``) runs
those scripts alone and keeps the other scripts' sections and figures as the file has
them, from their last run.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from _figures import PREFIX

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {  # script -> arguments
    "scaler_overhead.py": [],
    "multirank.py": [],
    "diagnosis.py": [],
    "telemetry.py": [],
    "control.py": [],
    "service.py": [],
    "load.py": [],
}
TIMEOUT_S = 1800
# docs/BENCHMARKS.md's figures of benches run by hand (too long, or needing a server for
# make bench), kept as they are between these markers when make bench rewrites the rest.
BY_HAND = ("<!-- by-hand:start -->", "<!-- by-hand:end -->")


def run(script: str, args: list[str]) -> tuple[str, list[list[str]], float, int]:
    print(f"bench: {script} {' '.join(args)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
    )
    seconds = time.monotonic() - started
    output = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.returncode else "")
    rows = [
        line[len(PREFIX) :].split("\t")
        for line in done.stdout.splitlines()
        if line.startswith(PREFIX)
    ]
    print(f"bench: {script} took {seconds:.0f} s, exit {done.returncode}", flush=True)
    return output, rows, seconds, done.returncode


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {version('torch')}, {platform.system()} {platform.release()}"
    )


def table(rows: list[list[str]]) -> str:
    lines = ["| figure | measured | goal | met | against baseline (same run) |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for name, value, goal, status, baseline in (r + [""] * (5 - len(r)) for r in rows):
        lines.append(f"| {name} | {value} | {goal} | {status} | {baseline} |")
    return "\n".join(lines)


def kept_sections(old: str) -> dict[str, str]:
    """The sections of the last docs/BENCHMARKS.md by script, as they were written."""
    body = old.split(BY_HAND[0], 1)[0]
    found = {}
    for part in body.split("\n## `bench/")[1:]:
        script = part.split("`", 1)[0]
        found[script] = "## `bench/" + part.rstrip("\n") + "\n"
    return found


def section_rows(section: str) -> list[list[str]]:
    return [
        line[len(PREFIX) :].split("\t") for line in section.splitlines() if line.startswith(PREFIX)
    ]


def main() -> int:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    only = set(sys.argv[1:])
    unknown = only - set(SCRIPTS)
    if unknown:
        print(f"bench: no such script: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out = ROOT / "docs" / "BENCHMARKS.md"
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    last = kept_sections(old)
    sections, all_rows, failed = [], [], []
    for script, args in SCRIPTS.items():
        if only and script not in only and script in last:
            sections.append(last[script])
            all_rows += section_rows(last[script])
            continue
        output, rows, seconds, code = run(script, args)
        all_rows += rows
        if code:
            failed.append(script)
        fence = "```"
        sections.append(
            f"## `bench/{script}`\n\n{seconds:.0f} s, exit {code}, {when}\n\n"
            f"{fence}text\n{output.strip()}\n{fence}\n"
        )
    summary = table(all_rows)
    rerun = f" (then {', '.join(sorted(only))} alone; the rest from its last run)" if only else ""
    by_hand = ""
    if BY_HAND[0] in old and BY_HAND[1] in old:
        kept = old.split(BY_HAND[0], 1)[1].split(BY_HAND[1], 1)[0]
        by_hand = f"\n{BY_HAND[0]}{kept}{BY_HAND[1]}\n"
    doc = (
        "# Benchmarks\n\n"
        f"Written by `make bench` on {when}{rerun}.\n\nMachine: {machine()}.\n\n"
        "Each ratio is measured side by side in the same run. Shared or loaded machines "
        "give noisy absolute numbers; the ratios are what the goals are about.\n\n"
        f"{summary}\n\n" + "\n".join(sections) + by_hand
    )
    out.write_text(doc, encoding="utf-8")
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
