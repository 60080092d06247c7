"""`warmenv stats [NAMESPACE]`: is the cache paying off?

Per namespace: entries and size, hits (by the origin of the entry served:
computed here, imported from a bundle, or fetched from the fleet's shared
tier, a column shown where there are such hits or a remote), misses, computations and the
seconds they took, and the seconds the hits saved (each hit entry's recorded
cost; where an entry hit recorded none, "at least" what the others saved, or
"unknown", and null in `--json`: never a number that is not known); per
imported bundle: its entries still here, their hits and the time they saved;
and how the last warm-ups (`warm_up`) ended, failures with their reason. A
compiler cache captured with the generic directory form has no counters: its
lookups are shown as "not counted". Counts come from every process that used
the environment (stores flush them every few seconds and on close). It only
reads; `--html FILE` also writes a small self-contained page with bar charts.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread

from warmenv._text import plural
from warmenv.caches._tools import counts_lookups
from warmenv.cli import _html
from warmenv.cli._environments import environment, named
from warmenv.cli._errors import Failure
from warmenv.cli._format import namespace_label, saved, saved_clause, size
from warmenv.cli._options import no_match, text_argument
from warmenv.cli._output import Output
from warmenv.persistence.namespace import matches_any
from warmenv.persistence.statistics import (
    BundleStatistics,
    EnvironmentStatistics,
    ImportRecord,
    NamespaceStatistics,
)
from warmenv.persistence.storage import Origin


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "stats",
        parents=[parent],
        help="show hits, misses and the time the cache saved",
        description="Show, per namespace of an environment (--env), its entries, hits by "
        "origin (local, imported, or remote: fetched from the fleet's shared tier), misses, "
        "computations and the seconds the hits saved, and per imported bundle the hits its "
        "entries served. Counts add up over every process that used the environment and "
        "survive restarts. Only reads.",
    )
    parser.add_argument(
        "namespace",
        metavar="NAMESPACE",
        nargs="?",
        help="only namespaces under this prefix (whole segments), e.g. app/2",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        help="also write a self-contained HTML page with bar charts to FILE",
    )
    parser.set_defaults(run=run)


def shown_origins(namespaces: list[NamespaceStatistics], *, fleet: bool) -> list[Origin]:
    """The origins hits are shown by: local and imported always, remote (the fleet's
    shared tier) where there are remote hits or a remote is configured."""
    remote = fleet or any(n.hits_by_origin.get(Origin.REMOTE) for n in namespaces)
    return [Origin.LOCAL, Origin.IMPORTED, *([Origin.REMOTE] if remote else [])]


def seconds(value: float) -> str:
    """A duration for a table: `0.120 s`, `12.3 s`, `4.2 min`, `3.1 h`, `1,234.5 h`."""
    if value < 10:
        return f"{value:.3f} s"
    if value < 600:
        return f"{value:.1f} s"
    if value < 36_000:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:,.1f} h"


def hit_rate(hits: int, misses: int) -> str:
    lookups = hits + misses
    return "-" if not lookups else f"{100 * hits / lookups:.1f}%"


def short_digest(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    return f"{algorithm}:{value[:12]}" if value else digest[:12]


def namespace_json(n: NamespaceStatistics) -> dict[str, Any]:
    counted = counts_lookups(n.namespace)
    return {
        "namespace": n.namespace,
        "text": n.text,
        "entries": n.entries,
        "bytes": n.bytes,
        "counted": counted,
        "hits": n.hits,
        "misses": n.misses,
        "hits_by_origin": {str(o): h for o, h in n.hits_by_origin.items()},
        "computes": n.computes,
        "compute_seconds": n.compute_seconds,
        "saved_seconds": n.saved_seconds if counted and not n.hit_without_cost else None,
        "hit_without_cost": n.hit_without_cost,
    }


def bundle_json(b: BundleStatistics) -> dict[str, Any]:
    return {
        "name": b.name,
        "digest": b.digest,
        "entries": b.entries,
        "imported": b.entries,
        "distinct_hits": b.distinct_hits,
        "hits": b.hits,
        "saved_seconds": b.saved_seconds if not b.hit_without_cost else None,
        "hit_without_cost": b.hit_without_cost,
        "figure": bundle_figure(b),
    }


def bundle_figure(b: BundleStatistics) -> str:
    """Did the bundle pay off, in one line: what it brought, how much of it served, the time."""
    said = saved(seconds(b.saved_seconds), b.saved_seconds, known=not b.hit_without_cost)
    return f"imported {b.entries:,}, hit {b.distinct_hits:,} distinct, saved {said}"


NOT_COUNTED = "not counted"
"""A namespace of a compiler cache whose tool has no counters (the generic directory form)."""


def lookups_row(n: NamespaceStatistics, origins: list[Origin]) -> list[str]:
    """A namespace's hits (and by origin), misses, hit rate, computations and time saved."""
    if not counts_lookups(n.namespace):
        return [NOT_COUNTED] * (len(origins) + 3) + [
            f"{n.computes:,}",
            seconds(n.compute_seconds),
            NOT_COUNTED,
        ]
    return [
        f"{n.hits:,}",
        *(f"{n.hits_by_origin.get(origin, 0):,}" for origin in origins),
        f"{n.misses:,}",
        hit_rate(n.hits, n.misses),
        f"{n.computes:,}",
        seconds(n.compute_seconds),
        saved(seconds(n.saved_seconds), n.saved_seconds, known=not n.hit_without_cost),
    ]


def import_json(record: ImportRecord) -> dict[str, Any]:
    return {
        "source": record.source,
        "outcome": record.outcome.value,
        "at": record.at,
        "bundle": record.bundle,
        "imported": record.imported,
        "skipped": record.skipped,
        "failed": record.failed,
        "error": record.error,
    }


_IMPORTS_SHOWN = 5


def when(at: float) -> str:
    """A record's time, in UTC to the second."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


async def run(args: argparse.Namespace, out: Output) -> int:
    prefix = None if args.namespace is None else text_argument(args.namespace, "NAMESPACE")
    prefixes = None if prefix is None or not prefix.strip("/") else [prefix]
    async with environment(args, out) as env:
        stats = await env.statistics()
    namespaces = [n for n in stats.namespaces if matches_any(n.namespace, prefixes)]
    if prefixes is not None and not namespaces:
        known = [n.namespace for n in stats.namespaces]
        raise Failure(f"{no_match(prefixes, known)} in {named(env)}", not_found=True)
    shown = EnvironmentStatistics(namespaces=namespaces, bundles=stats.bundles)
    origins = shown_origins(namespaces, fleet=env.remote is not None)
    out.table(
        f"statistics of {env.name!r}",
        [
            "namespace",
            "entries",
            "size",
            "hits",
            *(str(origin) for origin in origins),
            "misses",
            "hit rate",
            "computes",
            "compute time",
            "saved",
        ],
        [
            [
                namespace_label(n.namespace, text=n.text),
                f"{n.entries:,}",
                size(n.bytes),
                *lookups_row(n, origins),
            ]
            for n in namespaces
        ],
        empty=f"environment {env.name!r} holds no entries and has counted no lookups yet",
    )
    out.table(
        "imported bundles",
        ["bundle", "digest", "entries", "hit distinct", "hits", "saved"],
        [
            [
                b.name,
                short_digest(b.digest),
                f"{b.entries:,}",
                f"{b.distinct_hits:,}",
                f"{b.hits:,}",
                saved(seconds(b.saved_seconds), b.saved_seconds, known=not b.hit_without_cost),
            ]
            for b in stats.bundles
        ],
        empty="no bundles imported",
    )
    for b in stats.bundles:
        out.line(f"bundle {b.name}: {bundle_figure(b)}")
    if stats.imports:
        out.table(
            "last warm-ups",
            ["when (UTC)", "source", "outcome", "imported", "skipped", "why"],
            [
                [
                    when(r.at),
                    r.source,
                    r.outcome.value,
                    f"{r.imported:,}",
                    f"{r.skipped:,}",
                    r.error or "",
                ]
                for r in stats.imports[:_IMPORTS_SHOWN]
            ],
            empty="",
        )
    hits, misses = shown.hits, shown.misses
    if namespaces:
        said = saved_clause(
            hits, seconds(shown.saved_seconds), shown.saved_seconds, known=shown.saved_known
        )
        out.line(
            f"{plural(hits, 'hit')}, {plural(misses, 'miss', 'misses')} "
            f"(hit rate {hit_rate(hits, misses)}); {said} in "
            f"{plural(len(namespaces), 'namespace')}"
        )
    if args.html is not None:
        page = _html.page(env.name, shown, origins)
        await anyio.to_thread.run_sync(_html.write, args.html, page)
        out.line(f"wrote {args.html}")
    out.result(
        {
            "environment": env.name,
            "hits": hits,
            "misses": misses,
            "saved_seconds": shown.saved_seconds if shown.saved_known else None,
            "namespaces": [namespace_json(n) for n in namespaces],
            "bundles": [bundle_json(b) for b in stats.bundles],
            "imports": [import_json(r) for r in stats.imports],
            "html": None if args.html is None else str(args.html),
        }
    )
    return 0
