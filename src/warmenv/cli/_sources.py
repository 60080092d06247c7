"""Opening a BUNDLE argument, a file or an http(s) URL, for the commands that only read it.

`check`, `inspect` and `verify` read a private copy: a file is copied (as
`open_snapshot` does), a URL is downloaded with a progress bar into the
temporary directory (as `import` downloads it, by `warmenv.bundle.download`,
with its limits, resumption and clean-up). Either copy is removed on exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

from warmenv.bundle.base import Bundle
from warmenv.bundle.download import Download
from warmenv.bundle.open import open_snapshot
from warmenv.cli._options import source_label
from warmenv.cli._output import Output


@asynccontextmanager
async def opened(
    source: str | Path, out: Output, *, verified: bool = True
) -> AsyncIterator[Bundle]:
    """`source` (a path, or a URL: see `_options.bundle_source`) opened as a private bundle.

    `verified`: as `open_snapshot`'s (the caller checks the digest before reading
    entries); a download is validated as `import` validates one.
    """
    if isinstance(source, Path):
        async with open_snapshot(source, verified=verified) as bundle:
            yield bundle
        return
    download = Download(source, None, None)
    async with aclosing(download.fetch()) as fetching:
        first = await anext(fetching, None)  # the first step says the size, if the server does
        if first is not None:
            label = f"downloading {source_label(source)}"
            with out.download(label, first.total_bytes) as bar:
                bar.update(bytes=first.bytes_done)
                async for step in fetching:
                    bar.update(bytes=step.bytes_done)
    bundle = await download.open()  # it owns the downloaded file from here
    try:
        yield bundle
    finally:
        await bundle.aclose()
