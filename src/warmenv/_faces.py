"""Which `with` each face takes: `async with` for the async core, `with` for `warmenv.blocking`.

Every public context manager that is only one kind answers the other
statement the same way (`AsyncWith`, `SyncWith`, `AsyncOnly`, `SyncOnlyBlock`):
a bundle, a store, a lock's guard, `importing(...)`, `stream.enter(...)`.

The two faces open environments under one name (`open_environment`), so the
wrong statement is an easy slip; Python then says only that the object "does
not support the (asynchronous) context manager protocol". Each face's context
manager answers the other statement with a `TypeError` saying what to write,
and so does an async one that is awaited (`env = await open_environment()`,
where Python says only that it "can't be used in 'await' expression").
The answering methods exist at run time only: type checkers still see none
and flag the slip before it runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Generic, ParamSpec, TypeVar, final

__all__ = [
    "ASYNC_ONLY",
    "SYNC_ONLY",
    "AsyncOnly",
    "AsyncWith",
    "SyncOnly",
    "SyncOnlyBlock",
    "SyncWith",
    "async_only",
    "async_with_only",
    "not_awaitable",
    "sync_with_only",
]

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


def async_with_only(name: str, form: str) -> str:
    """The line for `with` used on `name`, an async context manager entered as `form`."""
    return (
        f"{name} is an async context manager: write `async with {form}:` in an async "
        "function, not `with` (from synchronous code, use warmenv.blocking)"
    )


def not_awaitable(name: str, form: str) -> str:
    """The line for `await` used on `name`, an async context manager entered as `form`."""
    return f"{name} is an async context manager, not awaitable: write `async with {form}:`"


def sync_with_only(name: str, form: str) -> str:
    """The line for `async with` used on `name`, a plain context manager entered as `form`."""
    return f"{name} is a plain context manager: write `with {form}:`, not `async with`"


class AsyncWith:
    """A base of the async core's context managers: a `with` or an `await` is told
    to write `async with` and how (`_async_form`)."""

    __slots__ = ()
    _async_form: ClassVar[str]

    if not TYPE_CHECKING:

        def __enter__(self):
            raise TypeError(async_with_only(type(self).__name__, self._async_form))

        def __await__(self):
            raise TypeError(not_awaitable(type(self).__name__, self._async_form))

        def __exit__(self, *exc_info):  # `with` needs it; never reached
            return None


class SyncWith:
    """A base of plain context managers: an `async with` is told to write `with`."""

    __slots__ = ()
    _sync_form: ClassVar[str]

    if not TYPE_CHECKING:

        async def __aenter__(self):
            raise TypeError(sync_with_only(type(self).__name__, self._sync_form))

        async def __aexit__(self, *exc_info):  # `async with` needs it; never reached
            return None


@final
class AsyncOnly(Generic[T]):
    """An async context manager (`block`, entered as `form`), and only that: a `with`
    is told `said`, an `await` to write `async with {form}:`."""

    __slots__ = ("_block", "_form", "_said")

    def __init__(self, block: AbstractAsyncContextManager[T], form: str, said: str) -> None:
        self._block = block
        self._form = form
        self._said = said

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
            raise TypeError(self._said)

        def __exit__(self, *exc_info):  # `with` needs it; never reached
            return None

        def __await__(self):
            raise TypeError(not_awaitable(self._form.partition(" as ")[0], self._form))


def async_only(
    form: str, said: str
) -> Callable[[Callable[P, AbstractAsyncContextManager[T]]], Callable[P, AsyncOnly[T]]]:
    """A decorator of an opener (an `asynccontextmanager`) entered as `form`, whose
    blocks tell a `with` `said` and an `await` what to write."""

    def decorate(
        opener: Callable[P, AbstractAsyncContextManager[T]],
    ) -> Callable[P, AsyncOnly[T]]:
        @functools.wraps(opener)
        def opening(*args: P.args, **kwargs: P.kwargs) -> AsyncOnly[T]:
            return AsyncOnly(opener(*args, **kwargs), form, said)

        return opening

    return decorate


class SyncOnly:
    """A base of `warmenv.blocking`'s context managers: an `async with` is told `SYNC_ONLY`."""

    __slots__ = ()

    if not TYPE_CHECKING:

        async def __aenter__(self):
            raise TypeError(SYNC_ONLY)

        async def __aexit__(self, *exc_info):  # `async with` needs it; never reached
            return None


@final
class SyncOnlyBlock(Generic[T]):
    """A plain context manager (`block`), and only that: an `async with` is told `said`."""

    __slots__ = ("_block", "_said")

    def __init__(self, block: AbstractContextManager[T], said: str) -> None:
        self._block = block
        self._said = said

    def __enter__(self) -> T:
        return self._block.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._block.__exit__(exc_type, exc, tb)

    if not TYPE_CHECKING:

        async def __aenter__(self):
            raise TypeError(self._said)

        async def __aexit__(self, *exc_info):  # `async with` needs it; never reached
            return None
