"""Turn the rows a long reliability run recorded into docs/reliability.md's table.

Run by `nox -s reliability`:
    python benchmarks/reliability_report.py REPORT.jsonl docs/reliability.md
"""

from __future__ import annotations

import json
import platform
import sqlite3
import sys
from datetime import date
from pathlib import Path

MARKER = "<!-- table: written by benchmarks/reliability_report.py -->"


def main() -> None:
    report, page = Path(sys.argv[1]), Path(sys.argv[2])
    rows: dict[str, dict[str, object]] = {}
    for line in report.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        # A scenario run once per backend fixture adds up to one row.
        seen = rows.setdefault(row["scenario"], {**row, "trials": 0, "failures": 0})
        seen["trials"] = int(str(seen["trials"])) + row["trials"]
        seen["failures"] = int(str(seen["failures"])) + row["failures"]
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
        f"| {r['scenario']} | {r['trials']:,} | {r['failures']} | {r['checked']} |"
        for r in rows.values()
    ]
    text = page.read_text()
    head = text.split(MARKER)[0]
    page.write_text(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
