"""`stgcnd engines list|prune`: what the engine store holds, and clean-up of stale artefacts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stgcnd.engines.store import EngineStore
from stgcnd.server.config import engines_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="list or prune the engine store",
                       description="List the engine store's artefacts with whether they match "
                                   "this machine, or remove the ones that cannot be used here "
                                   "any more (other TensorRT version or device, corrupt, "
                                   "leftovers of interrupted builds).")
    p.add_argument("action", choices=["list", "prune"],
                   help="list: show every artefact and whether it fits this machine; prune: "
                        "remove those that do not")
    p.add_argument("--engines", "--store", type=Path, default=None,
                   help="engine store directory (default: $STGCND_ENGINE_DIR, else the "
                        "daemon's: systemd StateDirectory, ./engines in a checkout, else "
                        "~/.cache/stgcnd/engines)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--dry-run", action="store_true", help="prune: only say what would go")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    store = EngineStore(engines_root(args.engines))
    if args.action == "list":
        rows = store.list()
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        if not rows:
            print(f"no artefacts in {store.root}")
            return 0
        for r in rows:
            v = r.get("validation") or {}
            top1 = (f"top1 {v['top1_agreement']:.1%}" if "top1_agreement" in v
                    else "not validated")
            size = f"{(r.get('size_bytes') or 0) / 2**20:.1f}MiB"
            print(f"{r['model']:<28} {r['backend']:<11} {r['precision']:<5} {r['device']:<5} "
                  f"b{r['max_batch']:<3} {size:>9} {top1:<14} {r['status']}  {r['path']}")
        return 0
    removed = store.prune(dry_run=args.dry_run)
    if args.json:
        print(json.dumps(removed, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for r in removed:
            print(f"{verb} {r['path']} ({r['reason']})")
        print(f"{len(removed)} file(s) {verb}")
    return 0
