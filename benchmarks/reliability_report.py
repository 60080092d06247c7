"""Turn the rows a long reliability run recorded into docs/reliability.md's table.

Run by `nox -s reliability`:
    python benchmarks/reliability_report.py REPORT.jsonl docs/reliability.md

That run covers every scenario, so the table is rewritten. A run of a few
long forms (`pytest -m slow -k ...`) passes `--merge`: its rows replace the
rows of the same scenarios, every other row (and its listed failures) is kept,
and a line under the heading names the rows rerun and when.

Each row is what a test observed (tests/helpers.py `reliability_row`): the
trials it entered and how many of them failed, with the first failure. The
page is written even when trials failed, so the table shows the failures;
`nox -s reliability` still fails in that case.
"""

from __future__ import annotations

import json
import platform
import re
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


def _run_of_today() -> str:
    return (
        f"{date.today().isoformat()} on {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )


def parse(table: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The headings and rows of a table `render` wrote, to merge a partial run into."""
    headings = [line for line in table.splitlines() if line.startswith("_")]
    rows: dict[str, dict[str, Any]] = {}
    for line in table.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 4 or cells[0] == "scenario" or set(cells[1]) <= {"-", ":"}:
            continue
        scenario, trials, failures, checked = cells
        rows[scenario] = {
            "scenario": scenario,
            "trials": int(trials.replace(",", "")),
            "failures": int(failures.replace(",", "")),
            "checked": checked,
            "failure_texts": [],
        }
    # A failure is listed as "- SCENARIO: TEXT"; the longest scenario that fits is its row.
    for line in table.splitlines():
        if not line.startswith("- "):
            continue
        fits = [s for s in rows if line[2:].startswith(_cell(s) + ": ")]
        if fits:
            scenario = max(fits, key=len)
            rows[scenario]["failure_texts"].append(line[2 + len(_cell(scenario)) + 2 :])
    return headings, rows


def render(rows: dict[str, dict[str, Any]], headings: list[str] | None = None) -> list[str]:
    lines = [
        MARKER,
        "",
        *(headings or [f"_Long run of {_run_of_today()}._"]),
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
    arguments = sys.argv[1:]
    merging = "--merge" in arguments
    report, page = (Path(a) for a in arguments if a != "--merge")
    recorded = report.read_text().splitlines() if report.exists() else []
    rows = merge(recorded)
    if not rows:
        sys.exit(f"{report} holds no rows: no scenario ran, so {page} was left as it was")
    head, _, table = page.read_text().partition(MARKER)
    headings = None
    if not merging:  # a full run: say which rows of the old table it did not produce
        dropped = [name for name in parse(table)[1] if name not in rows]
        if dropped:
            print(
                f"{len(dropped)} rows of {page} were produced by no run and are dropped "
                "(a scenario renamed or gone; else its test is missing from "
                "RELIABILITY_RUNS in noxfile.py): " + "; ".join(dropped),
                file=sys.stderr,
            )
    if merging:
        headings, kept = parse(table)
        rerun = ", ".join(f"*{_cell(name)}*" for name in rows)
        headings.append(f"_Rows rerun on {_run_of_today()}: {rerun}._")
        rows = {**kept, **rows}  # a rerun row takes its scenario's place; new rows go last
    page.write_text(head + "\n".join(render(rows, headings)) + "\n")


if __name__ == "__main__":
    main()
