"""Marked regions of a hand-written document that a program writes: the text between

    <!-- generated: NAME ... -->
    <!-- end generated -->

is NAME's, everything around it the author's. Replacing a region keeps the rest of the file
byte for byte, so prose and generated tables live in one document (`stgcnd docs`). A region
indented by its start marker (a table inside a list item) is indented as a whole. In a Python
file (a generated enum's members) the markers are comments: `# generated: NAME ...` and
`# end generated`."""

from __future__ import annotations

import re

from stgcnd.errors import UserError

END = "<!-- end generated -->"
_START = re.compile(r"^( *)<!-- generated: ([\w.-]+)(?: [^\n]*)? -->$", re.M)
PY_END = "# end generated"
_PY_START = re.compile(r"^( *)# generated: ([\w.-]+)(?: [^\n]*)?$", re.M)


def _python(where: str) -> bool:
    return where.endswith(".py")


def start_marker(name: str, source: str, where: str = "") -> str:
    text = f"generated: {name} (from {source}; `stgcnd docs --write`)"
    return f"# {text}" if _python(where) else f"<!-- {text} -->"


def end_marker(where: str = "") -> str:
    return PY_END if _python(where) else END


def regions(text: str, where: str) -> dict[str, tuple[int, int, str]]:
    """NAME -> (where its start marker line begins, where its end marker line begins, the
    markers' indent)."""
    found: dict[str, tuple[int, int, str]] = {}
    start, end_line = (_PY_START, PY_END) if _python(where) else (_START, END)
    for match in start.finditer(text):
        indent, name = match.groups()
        end = text.find("\n" + indent + end_line, match.end())
        if end < 0:
            raise UserError(f"{where}: the region {name!r} has no {end_line!r} line after it")
        if name in found:
            raise UserError(f"{where}: the region {name!r} is marked twice; keep one")
        later = start.search(text, match.end(), end)
        if later:
            raise UserError(f"{where}: the region {name!r} is not closed before "
                            f"{later.group(2)!r} starts; add {end_line!r}")
        found[name] = (match.start(), end + 1, indent)
    return found


def replace(text: str, name: str, source: str, body: str, where: str) -> str:
    """`text` with region NAME holding `body` (a blank line either side, so that a markdown
    table or list in it stays one block), its start marker written afresh."""
    spans = regions(text, where)
    if name not in spans:
        raise UserError(
            f"{where} has no region {name!r}: put the two lines "
            f"{start_marker(name, source, where)!r} and {end_marker(where)!r} where it goes, "
            "then run `stgcnd docs --write`")
    start, end, indent = spans[name]
    lines = [indent + line if line else line for line in body.rstrip("\n").split("\n")]
    return (text[:start] + indent + start_marker(name, source, where) + "\n\n" + "\n".join(lines)
            + "\n\n" + text[end:])
