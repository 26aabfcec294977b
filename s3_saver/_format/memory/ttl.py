"""TTL arithmetic and the store's clock.

- ``TTLConfig`` (LangGraph's): ``default_ttl`` (minutes) for puts that name no ``ttl``,
  ``refresh_on_read`` (default True) for reads that name no ``refresh_ttl``,
  ``sweep_interval_minutes`` for the sweeper, ``omit_expired`` accepted and moot: the
  store never returns an expired item, whatever it says.
- ``put(ttl=NOT_PROVIDED)`` takes ``default_ttl``; an explicit ``None`` means "never
  expires" (``BaseStore._ensure_ttl``; LangGraph Server passes ``None``). An overwrite
  without a ttl removes the old expiry.
- An item expires ``ttl`` minutes after its last write or refresh: ``expires_us =
  now + round(ttl * 60e6)``; it is expired once ``expires_us <= now``.
- A read that refreshes (``refresh_ttl``) moves the expiry of an item that has a ttl to
  ``now + ttl``, but only when that is due: ``expires - now < ttl * (1 - slack)``. With
  the default slack of 0.1 reads write an item at most once per tenth of its ttl, and
  it expires between 0.9 x ttl and ttl after its last read; ``slack=0`` refreshes on
  every read (PostgresStore's behaviour).

The clock: UTC microseconds, strictly increasing within a process (``max(source,
last + 1)``), so two writes of one process never share a timestamp and item order by
creation time is exact within a process. Tests inject the source.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from langgraph.store.base import NotProvided, TTLConfig

from s3_saver._format.memory.names import show
from s3_saver.errors import ConfigurationError

US_PER_MINUTE = 60_000_000
DEFAULT_REFRESH_SLACK = 0.1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TTL_KEYS = frozenset({"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"})


def _wall_us() -> int:
    return time.time_ns() // 1000


class Clock:
    """A strictly increasing microsecond clock: ``now()`` is ``max(source(), last + 1)``.

    ``source`` returns UTC microseconds (the wall clock by default). Thread-safe."""

    __slots__ = ("_last", "_lock", "_source")

    def __init__(self, source: Callable[[], int] | None = None) -> None:
        self._source = source or _wall_us
        self._last = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:
            t = max(int(self._source()), self._last + 1)
            self._last = t
            return t


PROCESS_CLOCK = Clock()
"""The clock of every store of the process that is given none (one per process, so two
stores of one process never stamp two writes alike)."""


def to_datetime(us: int) -> datetime:
    """A timestamp in microseconds as the aware UTC datetime ``Item`` carries (exact)."""
    return _EPOCH + timedelta(microseconds=us)


def epoch_seconds_up(us: int) -> int:
    """Microseconds as whole seconds, rounded up (DynamoDB's TTL attribute: an item is
    never deleted by DynamoDB before the store considers it expired)."""
    return -(-us // 1_000_000)


MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
"""The latest time the store keeps (created, updated, expiry): the last microsecond a
``datetime`` holds, well inside a 64-bit count (the bucket's documents) and a DynamoDB number."""
MAX_TTL_MINUTES = 1_000_000_000
"""The longest ttl (about 1,900 years): any expiry it gives stays below ``MAX_US``."""


def _check_minutes(value: Any, what: str) -> float:
    # Bounded, not only finite: an expiry past MAX_US cannot be written to a head (a
    # 64-bit count) and DynamoDB refuses its number; refused here, before any request,
    # the namespace is not registered for an item that is never written.
    if is_minutes(value):
        return float(value)
    raise ConfigurationError(
        f"{what} must be a finite number of minutes from 0 to {MAX_TTL_MINUTES:,} (about 1,900 years), or None;"
        f" got {show(value)}"
    )


def is_minutes(value: Any) -> bool:
    """Whether ``value`` is a ttl the store keeps: a number of minutes from 0 to ``MAX_TTL_MINUTES``."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and 0 <= value <= MAX_TTL_MINUTES
    )


def check_ttl_config(config: Mapping[str, Any] | None) -> TTLConfig | None:
    """The TTL configuration, checked (a copy), or None. ConfigurationError names a key the
    store does not know (a typo would otherwise silently mean "no TTL") or a bad value."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"ttl: a TTLConfig (dict) is expected, got {type(config).__name__}")
    unknown = set(config) - _TTL_KEYS
    if unknown:
        raise ConfigurationError(f"ttl: unknown keys {sorted(map(str, unknown))}; TTLConfig has {sorted(_TTL_KEYS)}")
    checked: dict[str, Any] = dict(config)
    if checked.get("default_ttl") is not None:
        checked["default_ttl"] = _check_minutes(checked["default_ttl"], "ttl['default_ttl']")
    for flag in ("refresh_on_read", "omit_expired"):
        if flag in checked and not isinstance(checked[flag], bool):
            raise ConfigurationError(f"ttl[{flag!r}] must be True or False, got {show(checked[flag])}")
    interval = checked.get("sweep_interval_minutes")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) or interval <= 0
    ):
        raise ConfigurationError(f"ttl['sweep_interval_minutes'] must be a number of minutes above 0 or None, got {show(interval)}")
    return checked  # type: ignore[return-value]


def put_ttl(ttl: Any, config: TTLConfig | None, *, namespace: tuple[str, ...] = (), key: str = "") -> float | None:
    """The ttl (minutes) a put stores: ``NOT_PROVIDED`` takes ``default_ttl`` (None without
    one), ``None`` never expires, a number is checked (finite, 0 or more: else
    ConfigurationError naming namespace and key)."""
    if isinstance(ttl, NotProvided):
        return config.get("default_ttl") if config else None
    if ttl is None:
        return None
    return _check_minutes(ttl, f"put of key {show(key)} in namespace {show(namespace)}: ttl")


def read_refresh(refresh_ttl: Any, config: TTLConfig | None) -> bool:
    """Whether a read refreshes: the op's flag, or (None) the config's ``refresh_on_read``,
    default True (``BaseStore._ensure_refresh``)."""
    if refresh_ttl is not None:
        return bool(refresh_ttl)
    if config is not None:
        return config.get("refresh_on_read", True)
    return True


def check_slack(slack: Any) -> float:
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not 0 <= slack < 1:
        raise ConfigurationError(f"refresh_slack must be a number from 0 (refresh on every read) up to, not including, 1; got {show(slack)}")
    return float(slack)


def ttl_us(ttl_minutes: float) -> int:
    """A ttl in minutes as microseconds (to the nearest one: 0.1 minutes is 6,000,000)."""
    return round(ttl_minutes * US_PER_MINUTE)


def expires_at(now: int, ttl_minutes: float | None) -> int | None:
    """When an item written (or refreshed) at ``now`` with this ttl expires (None: never)."""
    return None if ttl_minutes is None else now + ttl_us(ttl_minutes)


def is_expired(expires_us: int | None, now: int) -> bool:
    return expires_us is not None and expires_us <= now


def refresh_due(expires_us: int | None, ttl_minutes: float | None, now: int, slack: float = DEFAULT_REFRESH_SLACK) -> bool:
    """Whether a refreshing read at ``now`` should move this expiry (an unexpired item
    with a ttl whose remaining time fell below ``ttl x (1 - slack)``)."""
    if ttl_minutes is None or expires_us is None or expires_us <= now:
        return False
    return expires_us - now < ttl_us(ttl_minutes) * (1 - slack)


class Expiring(Protocol):
    """What a refresh plan reads of a row: its key, expiry and ttl."""

    @property
    def key(self) -> str: ...

    @property
    def expires_us(self) -> int | None: ...

    @property
    def ttl_minutes(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Refresh:
    """A due refresh of one item: its expiry moves from ``seen_us`` (as the read found it)
    to ``expires_us``. The write is fenced on ``seen_us``, so a refresh never revives a
    deleted item nor shortens the expiry a newer write gave it."""

    key: str
    seen_us: int
    expires_us: int


def plan_refreshes(
    returned: Iterable[tuple[tuple[str, ...], Expiring, bool]],
    written: Collection[tuple[tuple[str, ...], str]],
    now: int,
    slack: float = DEFAULT_REFRESH_SLACK,
) -> dict[tuple[str, ...], list[Refresh]]:
    """The refreshes a batch's reads call for, per namespace (one write per namespace in
    manifest mode), from ``returned``: ``(namespace, row as read, whether that read
    refreshes)`` for every item a get or search returned.

    An item is refreshed once however many reads returned it, only when due
    (``refresh_due``), and not at all when the batch itself puts or deletes it
    (``written``): that write lands after the reads and settles the item's expiry
    (InMemoryStore's order: a batch's reads, then its puts)."""
    plan: dict[tuple[str, ...], list[Refresh]] = {}
    seen: set[tuple[tuple[str, ...], str]] = set()
    for namespace, row, refresh in returned:
        where = (namespace, row.key)
        if not refresh or where in seen or where in written:
            continue
        if row.expires_us is None or not refresh_due(row.expires_us, row.ttl_minutes, now, slack):
            continue
        seen.add(where)
        moved = expires_at(now, row.ttl_minutes)
        assert moved is not None  # refresh_due is False without a ttl
        plan.setdefault(namespace, []).append(Refresh(row.key, row.expires_us, moved))
    return plan
