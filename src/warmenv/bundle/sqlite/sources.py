"""What reading an export's sources means to its caller: `InvalidSourceError`, naming them.

The sources are read by persistence (`warmenv.persistence.sqlite.export`),
which owns every statement run on an environment and raises what SQLite
says. This is where that becomes the error an export's caller acts on: a
file that is not an environment keeps persistence's message (it names the
file), and damage found reading one names the sources read.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from warmenv.bundle.errors import InvalidSourceError
from warmenv.persistence.sqlite.export import NotAnEnvironmentError

__all__ = ["reading"]


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """SQLite's errors reading the sources `what` as `InvalidSourceError`."""
    try:
        yield
    except NotAnEnvironmentError as exc:
        raise InvalidSourceError(str(exc)) from None
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InvalidSourceError(f"reading {what} failed ({exc})") from None
