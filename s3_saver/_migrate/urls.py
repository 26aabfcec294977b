"""open_saver: a LangGraph checkpoint saver from a URL (what ``migrate --from/--to`` take).

``sqlite:///path.db`` (relative; ``sqlite:////abs/path.db`` absolute), ``postgresql://``
or ``postgres://`` (a libpq URL), ``s3://bucket[/prefix]?table=...`` (S3Saver; no
``table``: the manifest index). A malformed URL is refused when ``open_saver`` is
called, before anything is opened; a database that cannot be opened, when the
returned context is entered. Both raise [ConfigurationError][s3_saver.errors.ConfigurationError]
naming the URL with its password masked.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from langgraph.checkpoint.base import BaseCheckpointSaver

from s3_saver._format.key_codec import LegacyPrefix
from s3_saver._saver.saver import S3Saver
from s3_saver.errors import ConfigurationError

FORMS = (
    "sqlite:///relative/path.db or sqlite:////absolute/path.db, "
    "postgresql://user:password@host:port/database, "
    "s3://bucket[/prefix]?table=T&region=R&endpoint_url=U"
)
# s3:// query parameters and the S3Saver arguments they set.
S3_PARAMETERS = {
    "table": "table",
    "region": "region_name",
    "endpoint_url": "endpoint_url",
    "s3_endpoint_url": "s3_endpoint_url",
    "dynamodb_endpoint_url": "dynamodb_endpoint_url",
}
_USERINFO_PASSWORD = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#]*):[^@/?#]*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#]*")


def mask(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and logs)."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))


def open_saver(url: str, *, create: bool = True) -> AbstractContextManager[BaseCheckpointSaver]:
    """A LangGraph checkpoint saver from a URL, as a context manager that closes it.

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``: a
      ``SqliteSaver`` over ``sqlite3.connect(path, check_same_thread=False)``
      (the file is created when missing; its directory must exist).
    - ``postgresql://user:password@host:port/database`` (or ``postgres://``):
      ``PostgresSaver.from_conn_string``, with ``setup()`` run so a fresh
      database works.
    - ``s3://bucket[/prefix]?table=T&region=R&endpoint_url=U&s3_endpoint_url=..&dynamodb_endpoint_url=..``:
      an [S3Saver][s3_saver.S3Saver] (no ``table``: the manifest index in the
      bucket). Its bucket and table must exist (``setup()`` or ``infra/``).

    Example:
        ```python
        with open_saver("sqlite:///checkpoints.db") as source:
            with open_saver("s3://my-bucket?table=T") as target:
                migrate(source, target)
        ```

    Args:
        url: One of the forms above.
        create: False for a store that is read from: a SQLite file that does
            not exist is then an error (a mistyped path would otherwise give an
            empty database, and a migration of nothing), and an S3 prefix that
            `S3Saver` refuses (one with a segment ``live``, ``manifests``,
            ``listing``, ``archive`` or ``set-aside``, see
            [Configuration][prefix-rules]) opens, to move what an earlier version
            stored under it to another prefix.

    Raises:
        ConfigurationError: An unknown scheme, a malformed URL, a missing
            optional package (the message names the extra to install), or a
            database that cannot be opened. The message names the URL, password masked.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"a saver URL must be a string, got {type(url).__name__}: {url!r}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        path = _sqlite_path(url)
        if not create and path != ":memory:" and not os.path.exists(path):
            raise ConfigurationError(f"{url}: no SQLite database file at {os.path.abspath(path)}")
        return _sqlite(url, path)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    if scheme == "s3":
        return _s3(url, create)
    named = f"scheme {scheme!r}" if scheme else "no scheme"
    raise ConfigurationError(f"{mask(url)}: unknown saver URL ({named}); expected {FORMS}")


def refuse_same_store(source: BaseCheckpointSaver, target: BaseCheckpointSaver) -> None:
    """Raise ConfigurationError when ``source`` and ``target`` store into the same place."""
    # Two S3Savers on one bucket and prefix write the same object keys whatever
    # their index: a "migration" between index modes there would leave each
    # index's objects to the other's gc and delete. A prefix belongs to one index
    # mode (``_transport/mode``): another mode's threads go under another prefix or bucket.
    same = source is target or (
        isinstance(source, S3Saver) and isinstance(target, S3Saver) and source._location() == target._location()
    )
    if same:
        raise ConfigurationError(
            f"source and target are the same store ({_describe(source)}): "
            "a prefix belongs to one index mode, so to change index mode or move threads, give the target "
            "another bucket or prefix"
        )


def _describe(saver: BaseCheckpointSaver) -> str:
    if isinstance(saver, S3Saver):
        bucket, prefix, _ = saver._location()
        return f"s3://{bucket}/{prefix}"
    return type(saver).__name__


# -- sqlite ----------------------------------------------------------------------------------
def _sqlite_path(url: str) -> str:
    if not url.lower().startswith("sqlite:///"):
        raise ConfigurationError(
            f"{url}: a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db (three slashes, no host)"
        )
    path = url[len("sqlite:///"):]
    if not path:
        raise ConfigurationError(f"{url}: no database file after sqlite:///")
    if path != ":memory:":
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise ConfigurationError(f"{url}: the directory {directory} of the database file does not exist")
        if os.path.isdir(path):
            raise ConfigurationError(f"{url}: {os.path.abspath(path)} is a directory, not a database file")
    return path


def _sqlite(url: str, path: str) -> AbstractContextManager[BaseCheckpointSaver]:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError as exc:
        raise _missing(url, "langgraph-checkpoint-sqlite", "sqlite", exc) from exc

    @contextmanager
    def opened() -> Iterator[BaseCheckpointSaver]:
        try:
            conn = sqlite3.connect(path, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ConfigurationError(f"{url}: cannot open the SQLite database: {exc}") from exc
        with closing(conn):
            saver = SqliteSaver(conn)
            try:
                saver.setup()  # a file that is not a SQLite database fails here, not mid-migration
            except sqlite3.Error as exc:
                raise ConfigurationError(f"{url}: cannot use the SQLite database: {exc}") from exc
            yield saver

    return opened()


# -- postgres ----------------------------------------------------------------------------------
def _postgres(url: str) -> AbstractContextManager[BaseCheckpointSaver]:
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:
        raise _missing(url, "langgraph-checkpoint-postgres and psycopg", "postgres", exc) from exc
    try:
        conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ConfigurationError(f"{mask(url)}: not a PostgreSQL URL ({_clean(exc, url)}); expected {FORMS}") from exc

    @contextmanager
    def opened() -> Iterator[BaseCheckpointSaver]:
        with ExitStack() as stack:
            try:
                saver = stack.enter_context(PostgresSaver.from_conn_string(url))
            except psycopg.Error as exc:
                raise ConfigurationError(f"{mask(url)}: cannot connect: {_clean(exc, url)}") from exc
            try:
                saver.setup()  # creates or migrates the tables; idempotent
            except psycopg.Error as exc:
                raise ConfigurationError(f"{mask(url)}: setup() failed: {_clean(exc, url)}") from exc
            yield saver

    return opened()


# -- s3 ----------------------------------------------------------------------------------------
def _s3(url: str, create: bool) -> AbstractContextManager[BaseCheckpointSaver]:
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigurationError(f"{mask(url)}: not an s3:// URL ({exc}); expected {FORMS}") from exc
    bucket = parts.netloc
    if not bucket or any(c in bucket for c in "@:") or parts.fragment:
        raise ConfigurationError(
            f"{mask(url)}: an S3 URL is s3://bucket[/prefix]?table=...: no user, port or #fragment"
        )
    prefix = unquote(parts.path.lstrip("/"))
    # A source may be a prefix savers refuse now (one inside another's folders)
    # that an earlier version accepted: read, to move its threads elsewhere.
    kwargs: dict[str, Any] = {"prefix": prefix if create else LegacyPrefix(prefix)}
    for name, value in pairs:
        if name not in S3_PARAMETERS:
            raise ConfigurationError(
                f"{mask(url)}: unknown parameter {name!r}; an s3:// URL takes {', '.join(S3_PARAMETERS)}"
            )
        argument = S3_PARAMETERS[name]
        if argument in kwargs:
            raise ConfigurationError(f"{mask(url)}: parameter {name!r} is given twice")
        if not value:
            raise ConfigurationError(f"{mask(url)}: parameter {name!r} has no value")
        kwargs[argument] = value
    try:
        # Constructing makes no network call: clients and threads come with the first request.
        return S3Saver(bucket, **kwargs)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{mask(url)}: {exc}") from exc


# -- helpers -----------------------------------------------------------------------------------
def _missing(url: str, what: str, extra: str, exc: ImportError) -> ConfigurationError:
    return ConfigurationError(
        f"{mask(url)} needs {what}, which is not installed ({exc}): "
        f"pip install '.[{extra}]' in a checkout of s3_saver (or its path instead of '.')"
    )


def _clean(exc: BaseException, url: str) -> str:
    """An error's message without the URL's password, should a library have quoted it."""
    text = str(exc).strip() or type(exc).__name__
    password = urlsplit(url).password if "://" in url else None
    return text.replace(password, "***") if password else text
