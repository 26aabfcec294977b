"""The package's imports run one way: the map in docs/contributing.md ("How the code is laid out").

The map is a table between ``<!-- wings -->`` and ``<!-- /wings -->``: one row per wing, the
wings (or public modules) it may import in backquotes. This test is the map's only reader and
the map its only source: a row changed there changes what is allowed here. A module may import
its own wing, and the wings its row names; nothing else of the package. Every import counts:
at module level, inside a function (a lazy import) and under ``if TYPE_CHECKING:``.

No circle either, in the package or in benchmarks/: a circle inside one wing is allowed by the
map but never needed (the import check of a wing cannot see it, so this one does).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "s3_saver"
MAP = REPO / "docs" / "contributing.md"
# Public modules: no ``_`` in their path (every other module sits in a private wing or has one).
PUBLIC = {"s3_saver", "s3_saver.__main__", "s3_saver.errors", "s3_saver.langgraph_server", "s3_saver.cli"}


# A row may name more than one place: ``cli/`` ``__main__.py`` are one wing (the first names it).
ALIASES: dict[str, str] = {}
# Rows whose "holds" begins with *next:*: wings being built, whose folder may not exist yet.
NEXT: set[str] = set()


def wing_map(text: str | None = None) -> dict[str, set[str]]:
    """wing -> what it may import, as the table says: ``_index/dynamodb/``, ``errors.py``,
    ``s3_saver`` (the package face, ``__init__.py``)."""
    text = MAP.read_text() if text is None else text
    block = text.split("<!-- wings -->", 1)[1].split("<!-- /wings -->", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        first, *others = re.findall(r"`([^`]+)`", cells[0])
        rows[first] = set(re.findall(r"`([^`]+)`", cells[-1]))
        ALIASES.update(dict.fromkeys(others, first))
        if cells[1].startswith("*next:*"):
            NEXT.add(first)
    return rows


def module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def wing_of(module: str, wings: dict[str, set[str]]) -> str:
    """The longest folder of the map holding ``module``, else its own file (``errors.py``),
    ``s3_saver`` for the package face."""
    if module == "s3_saver":
        return "s3_saver"
    rel = module.split(".")[1:]
    for n in range(len(rel), 0, -1):
        folder = "/".join(rel[:n]) + "/"
        if folder in wings and (n < len(rel) or (PKG.joinpath(*rel) / "__init__.py").exists()):
            return folder
    own = "/".join(rel) + ".py"
    return ALIASES.get(own, own)


def _is_module(name: str) -> bool:
    p = REPO.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import of a module of this repository."""
    tree = ast.parse(path.read_text() if source is None else source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module_of(path).split(".")
                pkg = pkg[: len(pkg) - node.level + (1 if path.name == "__init__.py" else 0)]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                # ``from s3_saver import _x`` imports the module _x, not the face.
                name = f"{base}.{a.name}"
                found.append((node.lineno, name if _is_module(name) else base))
    return sorted({(line, m) for line, m in found if m.split(".")[0] in ("s3_saver", "benchmarks")})


def problems(wings: dict[str, set[str]], sources: dict[Path, str | None]) -> list[str]:
    out = []
    for path, source in sources.items():
        here = wing_of(module_of(path), wings)
        if here not in wings:
            out.append(f"{path.relative_to(REPO)}: {here} is not on the map")
            continue
        for line, target in imports(path, source):
            there = wing_of(target, wings)
            if target.startswith("s3_saver") and there != here and there not in wings[here]:
                out.append(f"{path.relative_to(REPO)}:{line}: {here} imports {there} ({target}), "
                           f"against the map (it may import {', '.join(sorted(wings[here])) or 'nothing'})")
    return out


def package() -> dict[Path, str | None]:
    return {p: None for p in sorted(PKG.rglob("*.py"))}


def test_imports_follow_the_map() -> None:
    found = problems(wing_map(), package())
    assert not found, "\n".join(found)


def test_every_wing_is_on_the_map_and_every_row_is_a_wing() -> None:
    wings = wing_map()
    here = {wing_of(module_of(p), wings) for p in package()}
    assert here - set(wings) == set(), f"not on the map: {sorted(here - set(wings))}"
    assert set(wings) - here <= NEXT, f"rows that are no wing: {sorted(set(wings) - here - NEXT)}"
    assert here & NEXT == set(), f"built: drop *next:* from their rows: {sorted(here & NEXT)}"
    named = {w for allowed in wings.values() for w in allowed}
    assert named <= set(wings), sorted(named - set(wings))


def test_private_modules_start_with_an_underscore() -> None:
    """Public: the face, errors, langgraph_server, __main__, cli. Every other module is
    private by a ``_`` somewhere in its path (a private wing, or cli's ``_`` modules)."""
    loose = [m for m in map(module_of, package()) if m not in PUBLIC and not any(p.startswith("_") for p in m.split(".")[1:])]
    assert not loose, loose


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("_ops/put.py", "from s3_saver._saver.saver import S3Saver"),  # up a floor
        ("_format/keys.py", "from s3_saver._transport.protocol import Op"),  # sideways, the wrong way
        ("_index/dynamodb/items.py", "from s3_saver._index.manifest.doc import Head"),  # backend to backend
        ("_transport/sync.py", "def f():\n    from s3_saver._ops import put"),  # lazy
        ("_format/entries.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from s3_saver._index.base import Index"),
        ("_store/rows.py", "from s3_saver._saver.saver import S3Saver"),  # a facade never imports another
        ("_cache/node.py", "from s3_saver._store import rows"),
    ],
)
def test_the_check_refuses_an_import_against_the_map(where: str, line: str) -> None:
    assert problems(wing_map(), {PKG / where: line})


def _sources(root: Path) -> list[Path]:
    """The project's Python files under ``root``: not a virtualenv's (``make bench``
    builds the peer's under benchmarks/)."""
    return sorted(p for p in root.rglob("*.py") if not any(part.startswith(".venv") for part in p.relative_to(root).parts))


def _graph(root: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _sources(root):
        graph[module_of(path)] = {m for _, m in imports(path) if m.split(".")[0] == root.name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_benchmarks_measure_the_public_api() -> None:
    """The bench runs what users run: ``from s3_saver import ...`` only."""
    private = [f"{p.relative_to(REPO)}:{line}: {m}" for p in _sources(REPO / "benchmarks")
               for line, m in imports(p) if m.startswith("s3_saver.")]
    assert not private, private


@pytest.mark.parametrize("root", ["s3_saver", "benchmarks"])
def test_no_import_circle(root: str) -> None:
    assert circles(_graph(REPO / root)) == []
