"""mkdocs hook: the site shows the version pyproject.toml declares.

The footer of every page names it, and the home page's "Version X" must be the same: a
release that bumps pyproject.toml and forgets the home page fails `mkdocs build`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _project() -> dict[str, Any]:
    with _PYPROJECT.open("rb") as f:
        return tomllib.load(f)["project"]


def on_config(config: Any) -> Any:
    project = _project()
    config["copyright"] = f"{project['name']} {project['version']} · {project['license']['text']} License"
    config["extra"]["version"] = project["version"]
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        shown = re.findall(r"\bVersion (\S+?)\s", markdown)
        if shown != [config["extra"]["version"]]:
            raise PluginError(f"index.md shows version {shown}, pyproject.toml has {config['extra']['version']}")
    return markdown
