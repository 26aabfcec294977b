"""``MODULE:ATTR`` serializer specs, shared by the CLI's ``--serde`` and LangGraph Server's
``CHECKPOINT_SERDE``: threads written with a custom serializer are read with the same one."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from s3_saver.errors import ConfigurationError


def load_serde(spec: str) -> Any:
    """The serializer named by ``MODULE:ATTR``: an object with ``dumps_typed``/``loads_typed``,
    or a class or zero-argument factory that returns one (called here).

    The current directory is importable, as with ``python -m``, so a project's own
    module (``myapp.checkpoints:make_serde``) works from the console script too.

    Raises:
        ConfigurationError: A spec that does not name such an object; the message
            names the spec's part at fault, callers add which setting held it.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{spec!r} is not MODULE:ATTR")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigurationError(f"{module_name!r} has no attribute {attr!r}") from exc
    if isinstance(obj, type) or (callable(obj) and not is_serde(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise ConfigurationError(f"{spec}() failed: {type(exc).__name__}: {exc}") from exc
    if not is_serde(obj):
        raise ConfigurationError(
            f"{spec} is a {type(obj).__name__}, not a serializer (dumps_typed/loads_typed) or a factory of one"
        )
    return obj


def is_serde(obj: Any) -> bool:
    """An instance with callable ``dumps_typed`` and ``loads_typed`` (not a class)."""
    return not isinstance(obj, type) and callable(getattr(obj, "dumps_typed", None)) and callable(
        getattr(obj, "loads_typed", None)
    )
