"""Parameter types of the command line: durations, ``key=value`` filters, ``--serde MODULE:ATTR``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from s3_saver._saver.options import format_duration, parse_duration
from s3_saver._saver.serde import load_serde as _load_serde
from s3_saver.errors import ConfigurationError


class Duration(click.ParamType):
    """A duration option (``--older-than 1h``, ``--idle 30d``): a ``timedelta``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a duration (e.g. 90s, 30m, 1h, 7d, or plain seconds)", param, ctx)


class KeyValue(click.ParamType):
    """``key=value`` (``--filter``): the value is JSON when it parses (``step=3`` is the int 3,
    ``done=true`` the bool), a string otherwise (``user=ann``; ``user='"3"'`` is the string 3)."""

    name = "key=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        key, sep, raw = str(value).partition("=")
        if not sep or not key:
            self.fail(f"{value!r} is not key=value", param, ctx)
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = raw
        return key, parsed


def load_serde(spec: str) -> Any:
    """The serializer named by ``MODULE:ATTR`` (see `load_serde()`).

    Raises:
        click.BadParameter: A spec that does not name such an object (a usage error).
    """
    try:
        return _load_serde(spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="'--serde'") from exc
