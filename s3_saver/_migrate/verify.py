"""migrate's verification: a thread as the target lists it, compared with the source, strictly.

Values are compared with their types, all the way down: ``1`` and ``1.0``,
``True`` and ``1``, a tuple and a list are different values here though ``==``
says otherwise, so a target that changed a value's type is reported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from pydantic import BaseModel

from s3_saver.errors import MigrationError


def verify_thread(
    serde: SerializerProtocol,
    thread_id: str,
    source_ns: dict[str, list[CheckpointTuple]],
    target_ns: dict[str, list[CheckpointTuple]],
) -> int:
    """Compare a thread's namespaces as both savers list them; returns the checkpoints compared."""
    compared = 0
    for ns in sorted(set(source_ns) | set(target_ns)):
        mine, theirs = source_ns.get(ns, []), target_ns.get(ns, [])
        ids, other_ids = [checkpoint_id_of(t) for t in mine], [checkpoint_id_of(t) for t in theirs]
        known, other_known = set(ids), set(other_ids)
        missing = [c for c in ids if c not in other_known]
        if missing:
            raise MigrationError(thread_id, ns, missing[0], f"missing from the target ({len(missing)} of {len(ids)})")
        extra = [c for c in other_ids if c not in known]
        if extra:
            raise MigrationError(thread_id, ns, extra[0], f"the target has it, the source does not ({len(extra)} such)")
        if ids != other_ids:
            at = next(i for i, (a, b) in enumerate(zip(ids, other_ids)) if a != b)
            raise MigrationError(
                thread_id, ns, ids[at], f"listed in another order: the target lists {other_ids[at]} at position {at}"
            )
        for a, b in zip(mine, theirs):
            difference = _difference(serde, a, b)
            if difference:
                raise MigrationError(thread_id, ns, checkpoint_id_of(a), difference)
        compared += len(mine)
    return compared


def _difference(serde: SerializerProtocol, a: CheckpointTuple, b: CheckpointTuple) -> str | None:
    """What differs between a source and a target checkpoint tuple, in words; None when equal."""
    if parent_id_of(a) != parent_id_of(b):
        return f"parent differs: source {parent_id_of(a)!r}, target {parent_id_of(b)!r}"
    if not same(serde, a.metadata, b.metadata):
        keys = [k for k in {*a.metadata, *b.metadata} if not same(serde, a.metadata.get(k), b.metadata.get(k))]
        keys.sort(key=str)
        first = keys[0] if keys else None
        return f"metadata differs in {keys}; {first!r}{_where(serde, a.metadata.get(first), b.metadata.get(first))}"
    mine, theirs = dict[str, Any](a.checkpoint), dict[str, Any](b.checkpoint)
    for key in sorted({*mine, *theirs}):
        if key not in mine or key not in theirs:
            return f"checkpoint field {key!r} is only in the {'source' if key in mine else 'target'}"
        if key == "channel_values":
            values, other = mine[key], theirs[key]
            for ch in sorted({*values, *other}):
                if ch not in values or ch not in other:
                    return f"channel {ch!r} has a value only in the {'source' if ch in values else 'target'}"
                if not same(serde, values[ch], other[ch]):
                    return f"channel {ch!r} differs{_where(serde, values[ch], other[ch])}"
        elif not same(serde, mine[key], theirs[key]):
            return f"checkpoint field {key!r} differs{_where(serde, mine[key], theirs[key])}"
    writes, other_writes = list(a.pending_writes or []), list(b.pending_writes or [])
    if len(writes) != len(other_writes):
        return f"pending writes differ: {len(writes)} in the source, {len(other_writes)} in the target"
    for i, (x, y) in enumerate(zip(writes, other_writes)):
        if x[:2] != y[:2]:
            return f"pending write {i} differs: source {x[:2]} {_short(x[2])}, target {y[:2]} {_short(y[2])}"
        if not same(serde, x[2], y[2]):
            return f"pending write {i} {x[:2]} differs{_where(serde, x[2], y[2])}"
    return None


# -- strict equality -------------------------------------------------------------------------
def same(serde: SerializerProtocol, a: Any, b: Any) -> bool:
    """Equal and of the same types, through dicts, lists, tuples, sets, dataclasses,
    pydantic models (LangChain messages) and ``Send``; other values of one type
    compare with ``==``, or (without a useful ``==``: arrays, exceptions) serialized alike."""
    return _mismatch(serde, a, b) is None


def _mismatch(serde: SerializerProtocol, a: Any, b: Any) -> tuple[str, Any, Any] | None:
    """None when ``a`` and ``b`` are the same; else (path, source part, target part) of the first difference."""
    try:
        return _first(serde, a, b, "")
    except RecursionError:  # a value that contains itself
        return None if _serialized_alike(serde, a, b) else ("", a, b)


def _first(serde: SerializerProtocol, a: Any, b: Any, at: str) -> tuple[str, Any, Any] | None:
    if a is b:
        return None
    if type(a) is not type(b):
        return at, a, b
    if isinstance(a, dict):
        if len(a) != len(b) or {_typed(k) for k in a} != {_typed(k) for k in b}:
            return at, a, b
        return next((d for k, v in a.items() if (d := _first(serde, v, b[k], f"{at}[{k!r}]"))), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return at, a, b
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _first(serde, x, y, f"{at}[{i}]"))), None)
    if isinstance(a, (set, frozenset)):
        return None if {_typed(x) for x in a} == {_typed(x) for x in b} else (at, a, b)
    fields = _fields(a)
    if fields is not None:
        pairs = ((name, getattr(a, name), getattr(b, name)) for name in fields)
        return next((d for name, x, y in pairs if (d := _first(serde, x, y, f"{at}.{name}"))), None)
    try:
        if a == b:
            return None
    except Exception:  # e.g. an array's == is not a bool
        pass
    return None if _serialized_alike(serde, a, b) else (at, a, b)


def _fields(value: Any) -> list[str] | None:
    """The attributes that make up a dataclass, a pydantic model or a ``Send``; None for other values."""
    if isinstance(value, BaseModel):
        names = list(type(value).model_fields)
        return names + ["__pydantic_extra__"] if value.__pydantic_extra__ is not None else names
    if dataclasses.is_dataclass(value):
        return [f.name for f in dataclasses.fields(value) if f.compare]
    # Imported here: langgraph.types pulls in langchain_core's tracers (a quarter of
    # a second), which `import s3_saver` and every CLI start would pay for nothing.
    from langgraph.types import Send

    if isinstance(value, Send):
        return [name for name in ("node", "arg", "timeout") if hasattr(value, name)]
    return None


def _typed(value: Any) -> tuple[type, Any]:
    return type(value), value


def _serialized_alike(serde: SerializerProtocol, a: Any, b: Any) -> bool:
    try:
        return serde.dumps_typed(a) == serde.dumps_typed(b)
    except Exception:
        return False


def _where(serde: SerializerProtocol, a: Any, b: Any) -> str:
    """Where ``a`` and ``b`` first differ and how, e.g. `` at ['x'][0]: source 1 (int), target 1.0 (float)``."""
    path, x, y = _mismatch(serde, a, b) or ("", a, b)
    types = f" ({type(x).__name__})", f" ({type(y).__name__})"
    if type(x) is type(y):
        types = "", ""
    return f"{' at ' + path if path else ''}: source {_short(x)}{types[0]}, target {_short(y)}{types[1]}"


# -- reading tuples --------------------------------------------------------------------------
def checkpoint_id_of(tup: CheckpointTuple) -> str:
    return tup.config["configurable"]["checkpoint_id"]


def namespace_of(tup: CheckpointTuple) -> str:
    return tup.config["configurable"].get("checkpoint_ns") or ""


def parent_id_of(tup: CheckpointTuple) -> str | None:
    return ((tup.parent_config or {}).get("configurable") or {}).get("checkpoint_id") or None


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
