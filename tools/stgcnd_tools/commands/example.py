"""`stgcnd example`: a test checkpoint and windows files, to try every command before training.

The checkpoint is a plain two-stream st-gcn state_dict as the original code saves it (random
weights, seeded: its predictions mean nothing); the windows are synthetic MediaPipe skeletons.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from stgcnd.errors import UserError
from stgcnd.model.demo import demo_state_dict
from stgcnd.model.reference import torch_installed, torch_missing
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes import import_torch

EXAMPLE_SEED = 60  # not the demo model's: the example is a checkpoint of its own


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("example", help="write a test checkpoint and windows files",
                       description="Write a two-stream st-gcn checkpoint in the original "
                                   "code's format (random weights: its predictions mean "
                                   "nothing), a calibration windows file and a held-out one, "
                                   "so that export, build, validate and bench run before you "
                                   "have trained a model. Needs torch (the checkpoint is a "
                                   "torch.save file).")
    p.add_argument("--output-dir", "-o", type=Path, default=Path("example"),
                   help="where to write them (default: ./example)")
    p.add_argument("--frames", type=int, default=150, help="window length T (default: 150)")
    p.add_argument("--persons", type=int, default=1, help="person slots M (default: 1)")
    p.add_argument("--windows", type=int, default=64,
                   help="windows in each file (default: 64)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not torch_installed():
        raise torch_missing("writing a torch.save checkpoint")
    if min(args.frames, args.persons, args.windows) < 1:
        raise UserError("--frames, --persons and --windows take values >= 1")
    torch = import_torch()

    out: Path = args.output_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
        checkpoint = out / "epoch60_model.pt"
        torch.save(demo_state_dict(seed=EXAMPLE_SEED), checkpoint)
        shape = (args.frames, args.persons)
        calibration, held_out = out / "windows.npz", out / "held_out.npz"
        np.savez(calibration, windows=synthetic_windows(args.windows, *shape, seed=1))
        np.savez(held_out, windows=synthetic_windows(args.windows, *shape, seed=2))
    except OSError as exc:
        raise UserError(f"cannot write to {out}: {exc.strerror or exc}; choose another "
                        "--output-dir") from None
    print(f"wrote {checkpoint} (two-stream st-gcn, 2 classes, MediaPipe 33 joints; random "
          "weights)")
    print(f"wrote {calibration} and {held_out}: {args.windows} windows each, shaped "
          f"(N, 3, {args.frames}, 33, {args.persons})")
    return 0
