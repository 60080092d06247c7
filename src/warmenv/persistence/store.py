"""A typed map over one namespace's storage, with an in-process copy.

The storage is the shared truth (other processes, imported bundles); the
store keeps what it has seen in a dict so a hit costs a dict lookup, not a
thread hop. `EAGER` loads the whole namespace at open and never reads the
storage again, the mode for start-up caches small enough to hold; `LAZY`
reads a key from storage the first time it is asked for. A value that no
longer decodes (written by another version, or damaged) is a miss, and the
next insert replaces it, so one bad row can never wedge an application.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, final

from warmenv.persistence.codec import Codec, JsonCodec
from warmenv.persistence.storage import Conflict, Failed, Insertion, Purged, Storage, Stored
from warmenv.sync import OnceCell

__all__ = ["CacheMode", "Store"]

K = TypeVar("K")
V = TypeVar("V")

# Key types whose Python equality matches their canonical encoding, so a
# store can remember their encoded form instead of encoding on every hit.
_MEMO_TYPES = (str, int, bytes)


class CacheMode(enum.Enum):
    """When a `Store` reads its storage."""

    EAGER = "eager"
    """Load the namespace at open; never read the storage again."""
    LAZY = "lazy"
    """Read each key from storage on first access."""


@final
class Store(Generic[K, V]):
    """Typed keys to typed values over a `Storage`, with a local copy."""

    __slots__ = ("_codec", "_inflight", "_keys", "_mode", "_storage", "_undecodable", "_values")

    def __init__(self, storage: Storage, codec: Codec[K, V], mode: CacheMode) -> None:
        self._storage = storage
        self._codec = codec
        self._mode = mode
        self._values: dict[bytes, tuple[bytes, V]] = {}
        self._keys: dict[tuple[type, Any], bytes] = {}
        self._undecodable: set[bytes] = set()
        self._inflight: dict[bytes, OnceCell[V]] = {}

    @classmethod
    async def open(
        cls,
        storage: Storage,
        codec: Codec[K, V] | None = None,
        mode: CacheMode = CacheMode.EAGER,
    ) -> Store[K, V]:
        """A store over `storage`; in `EAGER` mode this loads the whole namespace."""
        store: Store[K, V] = cls(storage, JsonCodec() if codec is None else codec, mode)
        if mode is CacheMode.EAGER:
            async for key, data in storage.scan():
                store._remember(key, data)
        return store

    @property
    def storage(self) -> Storage:
        """The storage under this store."""
        return self._storage

    @property
    def mode(self) -> CacheMode:
        """When this store reads its storage."""
        return self._mode

    def __len__(self) -> int:
        """Entries held in memory (in `LAZY` mode, those faulted in so far)."""
        return len(self._values)

    async def get(self, key: K) -> V | None:
        """The value for `key`, or `None` on a miss."""
        encoded = self._encode_key(key)
        held = self._values.get(encoded)
        if held is not None:
            return held[1]
        if self._mode is CacheMode.EAGER:
            return None
        data = await self._storage.get(encoded)
        return None if data is None else self._remember(encoded, data)

    async def insert(self, key: K, value: V) -> Insertion:
        """Store `value`; a value the store already holds does not reach the storage."""
        encoded = self._encode_key(key)
        data = self._codec.encode_value(value)
        held = self._values.get(encoded)
        if held is not None and held[0] == data:
            return Stored()
        if encoded in self._undecodable:
            result: Insertion = await self._storage.replace(encoded, data)
        else:
            result = await self._storage.insert(encoded, data)
            if isinstance(result, Conflict) and self._remember(encoded, result.existing) is None:
                result = await self._storage.replace(encoded, data)
        if isinstance(result, Stored):
            self._undecodable.discard(encoded)
            self._values[encoded] = (data, value)
        return result

    async def get_or_compute(self, key: K, compute: Callable[[], Awaitable[V]]) -> V:
        """The stored value, or `await compute()` run once for all concurrent askers.

        If the storage already holds another value for the key (another
        process got there first), that value wins and is returned.
        """
        found = await self.get(key)
        if found is not None:
            return found
        encoded = self._encode_key(key)
        cell = self._inflight.get(encoded)
        if cell is None:
            cell = self._inflight[encoded] = OnceCell()

        async def fill() -> V:
            value = await compute()
            result = await self.insert(key, value)
            if isinstance(result, Conflict):
                return self._values[encoded][1]
            if isinstance(result, Failed):
                # Keep serving it from memory: the storage is a cache.
                self._values[encoded] = (self._codec.encode_value(value), value)
            return value

        try:
            return await cell.get_or_init(fill)
        finally:
            if cell.is_set() and self._inflight.get(encoded) is cell:
                del self._inflight[encoded]

    async def purge_key(self, key: K) -> Purged | Failed:
        """Forget one key here and delete it from the storage."""
        encoded = self._encode_key(key)
        self._values.pop(encoded, None)
        self._undecodable.discard(encoded)
        return await self._storage.purge_key(encoded)

    async def purge(self) -> Purged | Failed:
        """Forget everything here and delete the namespace from the storage."""
        self._values.clear()
        self._undecodable.clear()
        return await self._storage.purge()

    def _encode_key(self, key: K) -> bytes:
        if type(key) in _MEMO_TYPES:
            memo = (type(key), key)
            encoded = self._keys.get(memo)
            if encoded is None:
                encoded = self._keys[memo] = self._codec.encode_key(key)
            return encoded
        return self._codec.encode_key(key)

    def _remember(self, encoded: bytes, data: bytes) -> V | None:
        try:
            value = self._codec.decode_value(data)
        except ValueError:
            self._undecodable.add(encoded)
            self._values.pop(encoded, None)
            return None
        self._undecodable.discard(encoded)
        self._values[encoded] = (data, value)
        return value
