"""`warmenv stats --html`: one self-contained page of bar charts, no script, no fetch.

Inline SVG, so the file opens anywhere (a CI artifact, an e-mail) and shows
the same thing offline. Every name comes from the environment or a bundle
manifest, i.e. from outside: all of it is escaped.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from warmenv._fs import check_output_directory, non_regular_kind
from warmenv._text import clean, plural
from warmenv.bundle import formats
from warmenv.cli._format import namespace_label, saved_clause
from warmenv.persistence.statistics import EnvironmentStatistics
from warmenv.persistence.storage import Origin

_BAR = 18
_LABEL = 260
_WIDTH = 420
_COLOURS = {Origin.LOCAL: "#4c78a8", Origin.IMPORTED: "#f58518", Origin.REMOTE: "#b279a2"}


def _text(value: object) -> str:
    """Text from files for the page: control and format characters written as escapes
    (as on the terminal, so no ESC or bidi override reaches a `cat` or a browser),
    then HTML-escaped."""
    return html.escape(clean(value))


def _chart(
    title: str,
    rows: list[tuple[str, list[tuple[str, float, str]]]],
    unit: str,
    css: str,
    one: str | None = None,
) -> str:
    """A horizontal bar chart: per row, segments of (legend, value, colour) stacked.

    `one` is the unit's singular, for a value of exactly 1 ("1 hit")."""

    def counted(value: float, spec: str) -> str:
        return f"{value:{spec}} {_text(one if one is not None and value == 1 else unit)}"

    top = max((sum(v for _, v, _ in segs) for _, segs in rows), default=0.0) or 1.0
    height = 30 + _BAR * 1.5 * len(rows)
    parts = [
        f'<svg class="{css}" xmlns="http://www.w3.org/2000/svg" width="{_LABEL + _WIDTH + 120}" '
        f'height="{height:.0f}" role="img" aria-label="{_text(title)}">',
        f"<title>{_text(title)}</title>",
    ]
    for i, (label, segments) in enumerate(rows):
        y = 20 + i * _BAR * 1.5
        parts.append(
            f'<text x="{_LABEL - 6}" y="{y + _BAR * 0.75:.1f}" text-anchor="end">'
            f"{_text(label)}</text>"
        )
        x = float(_LABEL)
        total = 0.0
        for legend, value, colour in segments:
            width = _WIDTH * value / top
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{_BAR}" '
                f'fill="{colour}" data-label="{_text(label)}" '
                f'data-series="{_text(legend)}" data-value="{value:g}">'
                f"<title>{_text(f'{label}: {legend} ')}{counted(value, 'g')}</title></rect>"
            )
            x += width
            total += value
        parts.append(
            f'<text x="{x + 6:.1f}" y="{y + _BAR * 0.75:.1f}">{counted(total, ",.4g")}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def page(environment: str, stats: EnvironmentStatistics, origins: Sequence[Origin]) -> str:
    """The whole page: hits by `origins` and seconds saved per namespace, and per bundle."""
    name = _text(environment)
    hits_rows = [
        (
            namespace_label(n.namespace, text=n.text),
            [
                (str(origin), float(n.hits_by_origin.get(origin, 0)), _COLOURS[origin])
                for origin in origins
            ],
        )
        for n in stats.namespaces
    ]
    saved_rows = [
        (namespace_label(n.namespace, text=n.text), [("saved", n.saved_seconds, "#54a24b")])
        for n in stats.namespaces
    ]
    bundle_rows = [
        (
            f"{b.name} ({b.digest.partition(':')[2][:12] or b.digest[:12]})",
            [("saved", b.saved_seconds, "#54a24b")],
        )
        for b in stats.bundles
    ]
    sections = [
        f"<h1>warmenv statistics: {name}</h1>",
        f"<p>{plural(stats.hits, 'hit')}, {plural(stats.misses, 'miss', 'misses')}; "
        + saved_clause(
            stats.hits,
            f"{stats.saved_seconds:,.3f} s",
            stats.saved_seconds,
            known=stats.saved_known,
        )
        + ".</p>",
        "<h2>Hits by origin, per namespace</h2>",
        "<p>"
        + " ".join(
            f'<span style="color:{_COLOURS[origin]}">&#9632; {origin}</span>' for origin in origins
        )
        + "</p>",
        _chart("hits by origin per namespace", hits_rows, "hits", "hits", one="hit")
        if hits_rows
        else "<p>No namespaces.</p>",
        "<h2>Seconds saved, per namespace</h2>",
        _chart("seconds saved per namespace", saved_rows, "s", "saved-namespaces")
        if saved_rows
        else "<p>No namespaces.</p>",
        "<h2>Seconds saved, per imported bundle</h2>",
        _chart("seconds saved per bundle", bundle_rows, "s", "saved-bundles")
        if bundle_rows
        else "<p>No bundles imported.</p>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>warmenv statistics: {name}</title>"
        "<style>body{font-family:sans-serif;margin:2em}svg text{font-size:12px}</style>"
        "</head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def write(path: Path, text: str) -> None:
    """Write the page to `path`, replacing only an HTML page (an earlier report).

    Anything else there (an environment's database, someone's notes, a
    directory) is left as it is and refused, naming what it is; a missing
    directory is said as every command says it (`check_output_directory`).
    """
    if not os.path.lexists(path):
        check_output_directory(path)
    elif path.is_dir():
        raise IsADirectoryError(
            f"{path} is a directory: give a file to write the page to, such as "
            f"{path / 'stats.html'}"
        )
    elif (kind := non_regular_kind(path)) is not None:
        raise FileExistsError(f"'{path}' is {kind}, not an HTML page; {_LEFT}")
    else:
        with path.open("rb") as existing:
            head = existing.read(512)
        if formats.is_environment(head):
            raise FileExistsError(
                f"'{path}' is environment {path.stem!r} (a warmenv environment database), "
                f"not an HTML page; {_LEFT}"
            )
        if not head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n").lower().startswith(_PAGES):
            raise FileExistsError(f"'{path}' exists and is not an HTML page; {_LEFT}")
    path.write_text(text, encoding="utf-8")


_PAGES = ("<!doctype html", "<html")
_LEFT = "it was left as it is: choose another file for --html"
