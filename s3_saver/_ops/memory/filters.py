"""Search filters, evaluated as ``InMemoryStore`` evaluates them (``_compare_values``,
``_apply_operator`` in ``langgraph.store.memory``), reproduced here because they are private.

Semantics: each key of the filter names a top-level key of the item's value
(``value.get(key)``; nesting is by nested dicts, ``{"a": {"b": 1}}``, never by dotted
keys). A dict with any key starting with ``$`` is a set of operators that must all
hold: ``$eq``/``$ne`` are Python's ``==``/``!=``, ``$gt``/``$gte``/``$lt``/``$lte``
compare ``float(value)`` with ``float(operand)``. A list or tuple matches a list or
tuple of the same length element by element; anything else by ``==``.

Deliberate differences (the test harness's reference normalizes them, in one place):
- The filter is checked whole before anything is read (``check_filter``): an unknown
  operator, a dict mixing ``$`` and plain keys (InMemoryStore reads the plain key as
  an operator), an operand of ``$gt`` & co that ``float()`` refuses, or a non-string
  key raises InvalidFilterError, a ``ValueError`` as InMemoryStore's "Unsupported
  operator" is. InMemoryStore raises only when an item reaches the bad part (so a
  bad filter on an empty namespace "works" there).
- Where ``float()`` refuses the item's value (a string that is not a number, None for
  a missing key, a list), the item does not match. InMemoryStore lets the
  TypeError/ValueError out of ``search``: in a persistent store one item without the
  field would make every such search of its namespace fail, for good. (PostgresStore
  does not raise either.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from s3_saver._format.memory.names import show
from s3_saver.errors import InvalidFilterError

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
_NUMERIC = frozenset({"$gt", "$gte", "$lt", "$lte"})


def check_filter(filter: Any, namespace: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The filter, once every part of it can be evaluated (else InvalidFilterError
    naming the part, the filter and the searched ``namespace``). None or ``{}``: no filter."""
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise InvalidFilterError(
            f"search of {show(namespace)}: a filter is a dict, got {type(filter).__name__}: {show(filter)}",
            namespace,
            filter,
        )
    _check(filter, filter, namespace, top=True)
    return dict(filter) if filter else None


def _check(part: Any, whole: Any, namespace: tuple[str, ...], top: bool = False) -> None:
    # Only a dict is read as nested keys or operators (``compare_values``'s test); any other
    # value is compared with ``==``.
    if top or isinstance(part, dict):
        for k in part:
            if not isinstance(k, str):
                raise InvalidFilterError(
                    f"search of {show(namespace)}: filter keys are strings, got {show(k)} in {show(whole)}",
                    namespace,
                    whole,
                )
        if not top and any(k.startswith("$") for k in part):
            for op, operand in part.items():
                if op not in OPERATORS:
                    raise InvalidFilterError(
                        f"search of {show(namespace)}: unsupported operator {op!r} in filter {show(whole)}"
                        f" (the store knows {', '.join(sorted(OPERATORS))}; a dict with one $-key holds only operators)",
                        namespace,
                        whole,
                    )
                if op in _NUMERIC:
                    try:
                        float(operand)
                    except (TypeError, ValueError, OverflowError) as exc:
                        raise InvalidFilterError(
                            f"search of {show(namespace)}: {op} compares numbers, but its operand {show(operand)}"
                            f" is not one ({exc}) in filter {show(whole)}",
                            namespace,
                            whole,
                        ) from exc
            return
        for value in part.values():
            _check(value, whole, namespace)
    elif isinstance(part, (list, tuple)):
        for value in part:
            _check(value, whole, namespace)


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a filter ``check_filter`` accepted.

    The top level is InMemoryStore's ``all(_compare_values(value.get(k), v) ...)``: a
    top-level dict of operators is never looked for (a top-level key ``"$x"`` names
    the value's key ``"$x"``)."""
    if not filter:
        return True
    return all(compare_values(value.get(key), expected) for key, expected in filter.items())


def compare_values(item_value: Any, filter_value: Any) -> bool:
    """InMemoryStore's ``_compare_values``."""
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(apply_operator(item_value, op, operand) for op, operand in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(compare_values(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(compare_values(iv, fv) for iv, fv in zip(item_value, filter_value, strict=False))
        )
    return item_value == filter_value


def apply_operator(value: Any, operator: str, operand: Any) -> bool:
    """InMemoryStore's ``_apply_operator``, except that a value ``float()`` refuses does not
    match (the module docstring says why). Operators were checked by ``check_filter``."""
    if operator == "$eq":
        return value == operand
    if operator == "$ne":
        return value != operand
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    if operator == "$gt":
        return number > float(operand)
    if operator == "$gte":
        return number >= float(operand)
    if operator == "$lt":
        return number < float(operand)
    if operator == "$lte":
        return number <= float(operand)
    raise InvalidFilterError(f"unsupported operator {operator!r}", (), None)
