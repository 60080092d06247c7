"""Turn the rows a long reliability run recorded into docs/reliability.md's table.

Run by `nox -s reliability`:
    python benchmarks/reliability_report.py REPORT.jsonl docs/reliability.md

Each row is what a test observed (tests/helpers.py `reliability_row`): the
trials it entered and how many of them failed, with the first failure. The
page is written even when trials failed, so the table shows the failures;
`nox -s reliability` still fails in that case.
"""

from __future__ import annotations

import json
import platform
import sqlite3
import sys
from datetime import date
from pathlib import Path
from typing import Any

MARKER = "<!-- table: written by benchmarks/reliability_report.py -->"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def merge(lines: list[str]) -> dict[str, dict[str, Any]]:
    """One row per scenario; a scenario run once per backend fixture adds up."""
    rows: dict[str, dict[str, Any]] = {}
    for line in lines:
        if not line.strip():
            continue
        row = json.loads(line)
        seen = rows.setdefault(
            row["scenario"], {**row, "trials": 0, "failures": 0, "failure_texts": []}
        )
        seen["trials"] += int(row["trials"])
        seen["failures"] += int(row["failures"])
        if row.get("failure"):
            seen["failure_texts"].append(row["failure"])
        if not row["failures"]:
            seen["checked"] = row["checked"]  # what a passing run checked, when there is one
    return rows


def render(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        MARKER,
        "",
        f"_Long run of {date.today().isoformat()} on {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}._",
        "",
        '| scenario | trials | failures | what "nothing lost" was checked against |',
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {_cell(r['scenario'])} | {r['trials']:,} | {r['failures']:,} | {_cell(r['checked'])} |"
        for r in rows.values()
    ]
    failed = [r for r in rows.values() if r["failures"]]
    lines.append("")
    if failed:
        lines.append(f"**{sum(r['failures'] for r in failed)} trials failed:**")
        lines.append("")
        lines += [
            f"- {_cell(r['scenario'])}: {_cell(text)}"
            for r in failed
            for text in r["failure_texts"]
        ]
    else:
        lines.append(f"No trial failed ({sum(r['trials'] for r in rows.values()):,} trials).")
    return lines


def main() -> None:
    report, page = Path(sys.argv[1]), Path(sys.argv[2])
    recorded = report.read_text().splitlines() if report.exists() else []
    rows = merge(recorded)
    if not rows:
        sys.exit(f"{report} holds no rows: no scenario ran, so {page} was left as it was")
    text = page.read_text()
    head = text.split(MARKER)[0]
    page.write_text(head + "\n".join(render(rows)) + "\n")


if __name__ == "__main__":
    main()
