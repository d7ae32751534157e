"""`stgcnd docs [--write]`: the documentation's generated parts (stgcnd_tools/docs/generated.py).

Run in a checkout after changing what a part is made from (a configuration key, an error code,
a busy reason, a limit): `--write` makes every part afresh; without it, the stale files are
listed and the exit status is 1 (what tests/test_generated_docs.py and so CI check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import stgcnd
from stgcnd.errors import UserError
from stgcnd_tools.docs.generated import FIX, PARTS, stale, write

# The checkout this package was imported from (daemon/stgcnd/__init__.py -> the root).
CHECKOUT = Path(stgcnd.__file__).resolve().parents[2]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "docs", help="check, or write, the documentation's generated parts",
        description="The parts of README.md, docs/protocol.md, docs/hardening.md, "
                    "systemd/stgcnd.toml and the client's protocol.py (its ErrorCode and "
                    "Reason members) made from the code: "
                    + ", ".join(f"{p.name} ({p.path})" for p in PARTS) + ". Each lives "
                    "between '<!-- generated: NAME ... -->' and '<!-- end generated -->' "
                    "lines ('# generated: NAME ...', '# end generated' in Python); the text "
                    "around them is left as it is. Exit status 1 while one is stale.")
    parser.add_argument("--write", action="store_true",
                        help="make every part afresh (else: only say which files are stale)")
    parser.add_argument("--root", type=Path, default=None, metavar="DIR",
                        help="the checkout (default: the one stgcnd is imported from)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.root or CHECKOUT
    if not (root / "docs" / "protocol.md").is_file():
        raise UserError(f"{root} is not a stgcnd checkout (no docs/protocol.md); pass --root "
                        "with the checkout's directory")
    if args.write:
        changed = write(root)
        print(f"wrote {', '.join(changed)}" if changed else "every generated part is current")
        return 0
    files = stale(root)
    if not files:
        print("every generated part is current")
        return 0
    print(f"stale: {', '.join(files)}; run `{FIX}`", file=sys.stderr)
    return 1
