"""How the report draws: a table as aligned text or as GitHub markdown, and a saver's short name.

Below every module that draws a table (report, longconv_report, scale_report), so none of them
imports another to draw one.
"""

from __future__ import annotations

from typing import Any

from benchmarks import peers

# The savers' keys in the runner's document.
S3 = "s3"
MEMORY = "memory"
S3_MANIFEST = "s3-manifest"

MARKDOWN = False  # set by report.render(markdown=True): tables as GitHub markdown


def table(headers: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    if MARKDOWN:
        sep = ["---" if a == "l" else "---:" for a in align]
        return "\n".join("| " + " | ".join(r) + " |" for r in [cells[0], sep] + cells[1:])

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def short(doc: dict[str, Any], key: str) -> str:
    if peers.is_peer(key):
        return peers.PEERS[key].short
    return {S3: "S3Saver", MEMORY: "InMemory", "s3-manifest": "S3Saver(manifest)"}.get(key, key)
