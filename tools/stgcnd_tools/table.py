"""The one table formatter of the tools: aligned text columns (bench, loadtest, demo, logs,
trtexec parse) and Markdown (trtexec report)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(value: object, digits: int = 1) -> str:
    """None as '-' (never `nan`), a float with `digits` decimals, anything else as str()."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def num(value: object, digits: int = 4, none: str = "–") -> str:
    """A float to `digits` significant digits, None as `none`, anything else as str()."""
    if value is None:
        return none
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def table(head: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1,
          digits: int = 1, indent: str = "", rule: bool = True) -> list[str]:
    """Lines of columns as wide as their widest cell, the first `left` left-aligned and the
    others right-aligned, a rule of dashes under the head."""
    cells = [list(head)] + [[cell(v, digits) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [indent + "  ".join(c.ljust(w) if i < left else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in cells]
    if rule:
        lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return lines


def markdown(head: Sequence[str], rows: Iterable[Sequence[object]], digits: int = 4) -> list[str]:
    """A Markdown table (then a blank line); floats to `digits` significant digits."""
    def md(value: object) -> str:
        return num(value, digits).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(md(c) for c in row) + " |" for row in rows] + [""]
