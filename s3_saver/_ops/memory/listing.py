"""``list_namespaces``: match conditions, depth, order and paging, as ``InMemoryStore``'s
``_handle_list_namespaces`` and ``_does_match`` give them.

InMemoryStore keeps every matching namespace, truncates them to ``max_depth``, sorts
the distinct results in Python's tuple order and slices ``[offset:offset + limit]``.
The store reads its registry in that same order (``names.registry_key`` sorts as the
tuples do), so ``page_namespaces`` works on a sorted stream and stops reading once the
page is full: truncating sorted tuples to one depth keeps them sorted and puts equal
results next to each other.

Deliberate differences: a ``MatchCondition`` whose path is a ``str`` is taken as a
one-label path (PostgresStore's own tests pass ``MatchCondition("suffix", "public")``);
negative ``limit``, ``offset`` or ``max_depth`` are refused (ConfigurationError) where
InMemoryStore slices with them from the end; an unknown match type is refused whole,
before anything is read (InMemoryStore raises only once a namespace is compared).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from langgraph.store.base import ListNamespacesOp, MatchCondition

from s3_saver._format.memory.names import check_labels, registry_key, show
from s3_saver.errors import ConfigurationError

WILDCARD = "*"


def check_count(value: Any, what: str, op: str) -> int:
    """A non-negative int (``limit``, ``offset``, ``max_depth``), else ConfigurationError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{op}: {what} must be an int of 0 or more, got {show(value)}")
    return value


def check_list_op(op: ListNamespacesOp) -> ListNamespacesOp:
    """The op with every match path a checked tuple of labels, or ConfigurationError /
    NamespaceError naming what is wrong."""
    conditions = []
    for condition in op.match_conditions or ():
        if not isinstance(condition, MatchCondition):
            match_type, path = condition
        else:
            match_type, path = condition.match_type, condition.path
        if match_type not in ("prefix", "suffix"):
            raise ConfigurationError(
                f"list_namespaces: unsupported match type {show(match_type)} (the store knows 'prefix' and 'suffix')"
            )
        if isinstance(path, str):
            path = (path,)
        path = check_labels(path, what=f"{match_type} match path")
        registry_key(path)
        conditions.append(MatchCondition(match_type=match_type, path=path))
    max_depth = None if op.max_depth is None else check_count(op.max_depth, "max_depth", "list_namespaces")
    return ListNamespacesOp(
        match_conditions=tuple(conditions),
        max_depth=max_depth,
        limit=check_count(op.limit, "limit", "list_namespaces"),
        offset=check_count(op.offset, "offset", "list_namespaces"),
    )


def does_match(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """InMemoryStore's ``_does_match``: ``"*"`` matches any one label; a namespace shorter
    than the path never matches."""
    path = condition.path
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    else:
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    return all(p == WILDCARD or k == p for k, p in pairs)


def fixed_prefix(op: ListNamespacesOp) -> tuple[str, ...]:
    """The labels every listed namespace starts with: the longest run of labels before the
    first ``"*"`` among the op's prefix conditions (``()`` when none). Reading the
    registry range of this prefix (``names.registry_bounds``) reads every candidate."""
    best: tuple[str, ...] = ()
    for condition in op.match_conditions or ():
        if condition.match_type != "prefix":
            continue
        fixed = []
        for label in condition.path:
            if label == WILDCARD:
                break
            fixed.append(label)
        if len(fixed) > len(best):
            best = tuple(fixed)
    return best


def page_namespaces(namespaces: Iterable[tuple[str, ...]], op: ListNamespacesOp) -> list[tuple[str, ...]]:
    """The page ``op`` asks for, from ``namespaces`` in ascending tuple order without
    repeats (the registry's order), reading no further than the page needs.

    Equal to InMemoryStore's ``sorted({ns[:max_depth] for matching ns})[offset:offset+limit]``
    (or ``sorted(matching)`` without ``max_depth``) for an op ``check_list_op`` accepted."""
    if op.limit == 0:
        return []
    page: list[tuple[str, ...]] = []
    skip = op.offset
    for ns in _distinct(_truncated(_matching(namespaces, op), op.max_depth)):
        if skip:
            skip -= 1
            continue
        page.append(ns)
        if len(page) == op.limit:
            break
    return page


def _matching(namespaces: Iterable[tuple[str, ...]], op: ListNamespacesOp) -> Iterator[tuple[str, ...]]:
    conditions = op.match_conditions or ()
    for ns in namespaces:
        if all(does_match(c, ns) for c in conditions):
            yield ns


def _truncated(namespaces: Iterator[tuple[str, ...]], max_depth: int | None) -> Iterator[tuple[str, ...]]:
    # For sorted input and a fixed depth d, s <= t implies s[:d] <= t[:d]: the output stays
    # sorted and equal results are adjacent (what _distinct relies on).
    if max_depth is None:
        yield from namespaces
    else:
        for ns in namespaces:
            yield ns[:max_depth]


def _distinct(namespaces: Iterator[tuple[str, ...]]) -> Iterator[tuple[str, ...]]:
    last: tuple[str, ...] | None = None
    for ns in namespaces:
        if ns != last:
            yield ns
            last = ns
