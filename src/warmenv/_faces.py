"""Which `with` each face takes: `async with` for the async core, `with` for `warmenv.blocking`.

The two faces open environments under one name (`open_environment`), so the
wrong statement is an easy slip; Python then says only that the object "does
not support the (asynchronous) context manager protocol". Each face's context
manager answers the other statement with a `TypeError` saying what to write.
The answering methods exist at run time only: type checkers still see none
and flag the slip before it runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar, final

__all__ = ["ASYNC_ONLY", "SYNC_ONLY", "AsyncOnly", "SyncOnly", "async_only"]

P = ParamSpec("P")
T = TypeVar("T")

ASYNC_ONLY = (
    "open_environment() is an async context manager: write `async with "
    "open_environment(...) as env:`; from synchronous code use "
    "`with warmenv.blocking.open_environment(...) as env:`"
)
SYNC_ONLY = (
    "warmenv.blocking's environments are for synchronous code: write `with "
    "warmenv.blocking.open_environment(...) as env:`; in async code use `async with "
    "warmenv.open_environment(...) as env:`"
)


@final
class AsyncOnly(Generic[T]):
    """An async context manager (`block`), and only that: a `with` is told `ASYNC_ONLY`."""

    __slots__ = ("_block",)

    def __init__(self, block: AbstractAsyncContextManager[T]) -> None:
        self._block = block

    async def __aenter__(self) -> T:
        return await self._block.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._block.__aexit__(exc_type, exc, tb)

    if not TYPE_CHECKING:

        def __enter__(self):
            raise TypeError(ASYNC_ONLY)

        def __exit__(self, *exc_info):  # `with` needs it; never reached
            return None


def async_only(
    opener: Callable[P, AbstractAsyncContextManager[T]],
) -> Callable[P, AsyncOnly[T]]:
    """`opener` (an `asynccontextmanager`), whose blocks tell a `with` what to write."""

    @functools.wraps(opener)
    def opening(*args: P.args, **kwargs: P.kwargs) -> AsyncOnly[T]:
        return AsyncOnly(opener(*args, **kwargs))

    return opening


class SyncOnly:
    """A base of `warmenv.blocking`'s context managers: an `async with` is told `SYNC_ONLY`."""

    __slots__ = ()

    if not TYPE_CHECKING:

        async def __aenter__(self):
            raise TypeError(SYNC_ONLY)

        async def __aexit__(self, *exc_info):  # `async with` needs it; never reached
            return None
