#!/usr/bin/env python3
"""Every line budget (tests/test_layers.py's MAX_*_LINES): what it measures now, the budget
and the headroom; with --update, each budget set to its measure + 3 %.

    python scripts/line_budgets.py                        # the table; exit 1 if one is over
    python scripts/line_budgets.py --update --why "#44: the events subsystem"

The count is test_layers' own (`line_counts()`), so this and the tests cannot disagree.
--update keeps every comment and writes one line above each budget: the measure it was set
from, and --why, which a budget that rises needs (CONTRIBUTING.md: a raised budget says what
grew and why). A budget that falls needs no reason.
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests import test_layers  # noqa: E402  (the tests' own count, found from here)

HEADROOM = 0.03
BUDGET = re.compile(r"^(MAX_\w+_LINES) = (\d+)$", re.M)
MARK = "# Set by scripts/line_budgets.py --update"
MORE = "#   "  # its continuation lines


def budgets(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in BUDGET.findall(text)}


def table(counts: dict[str, int], limits: dict[str, int]) -> str:
    rows = [f"{'budget':<26}{'measured':>9}{'budget':>9}{'headroom':>16}  counts"]
    for name, limit in limits.items():
        measured, left = counts[name], limit - counts[name]
        headroom = f"{left:,} ({100 * left / limit:.1f} %)" if left >= 0 else f"OVER by {-left:,}"
        rows.append(f"{name:<26}{measured:>9,}{limit:>9,}{headroom:>16}  "
                    f"{test_layers.BUDGETS.get(name, '')}")
    return "\n".join(rows)


def updated(text: str, counts: dict[str, int], why: str, today: str) -> str:
    """`text` with each budget at its measure + HEADROOM, and the comment above it saying so
    (one this script wrote before replaced; every other line kept)."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        found = BUDGET.match(line.rstrip("\n"))
        if found:
            name, measured = found.group(1), counts[found.group(1)]
            marks = [i for i, kept in enumerate(out) if kept.startswith(MARK)]
            if marks and all(kept.startswith(MORE) for kept in out[marks[-1] + 1:]):
                del out[marks[-1]:]
            reason = f" ({why})" if why else ""
            note = f"{MARK[2:]} on {today}: {measured:,} measured + 3 %{reason}."
            out += [f"{row}\n" for row in textwrap.wrap(note, 100, initial_indent="# ",
                                                        subsequent_indent=MORE)]
            line = f"{name} = {math.ceil(measured * (1 + HEADROOM))}\n"
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true",
                        help="set every budget to its measure + 3 %% (default: only print)")
    parser.add_argument("--why", default="",
                        help="what grew and why, written beside the budgets; needed when one "
                             "rises (default: none)")
    parser.add_argument("--file", type=Path, default=REPO / "tests" / "test_layers.py",
                        help="the file that holds the budgets (default: tests/test_layers.py)")
    args = parser.parse_args(argv)
    text = args.file.read_text()
    counts, limits = test_layers.line_counts(), budgets(text)
    print(table(counts, limits))
    if not args.update:
        over = [name for name, limit in limits.items() if counts[name] > limit]
        if over:
            print(f"\nover: {', '.join(over)}. Cut lines, or raise with --update --why "
                  f"'what grew and why'.", file=sys.stderr)
        return 1 if over else 0
    new = updated(text, counts, args.why, datetime.date.today().isoformat())
    rising = [name for name, limit in budgets(new).items() if limit > limits[name]]
    if rising and not args.why:
        print(f"\n{', '.join(rising)} would rise: say what grew and why with --why '...' "
              f"(nothing written).", file=sys.stderr)
        return 1
    args.file.write_text(new)
    for name, limit in budgets(new).items():
        print(f"{name}: {limits[name]:,} -> {limit:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
