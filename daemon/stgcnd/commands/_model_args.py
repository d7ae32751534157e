"""The model flags shared by export, build, validate and bench."""

from __future__ import annotations

import argparse
from pathlib import Path

from stgcnd.errors import UserError
from stgcnd.model.layouts import LAYOUTS
from stgcnd.model.spec import GRAPH_OPS, MOTION_FORMULAS, ModelSpec


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--checkpoint", type=Path, default=None,
                   help="st-gcn checkpoint (.pt/.pth state_dict); omitted: the demo model, "
                        "whose predictions mean nothing")
    g.add_argument("--layout", default="mediapipe", choices=sorted(LAYOUTS),
                   help="skeleton layout (default: mediapipe, 33 joints)")
    g.add_argument("--persons", type=int, default=1, help="person slots M (default: 1)")
    g.add_argument("--frames", type=int, default=150, help="window length T (default: 150)")
    g.add_argument("--motion", default="first-difference", choices=MOTION_FORMULAS,
                   help="motion stream formula the model was trained with "
                        "(default: first-difference)")
    g.add_argument("--labels", nargs="+", default=None, help="class names, in class order")
    g.add_argument("--graph-op", default="matmul", choices=GRAPH_OPS,
                   help="how the graph step is written in exported graphs (default: matmul, "
                        "measured faster)")


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    try:
        return ModelSpec(checkpoint=args.checkpoint, layout=args.layout, persons=args.persons,
                         frames=args.frames, motion=args.motion, labels=tuple(args.labels or ()),
                         graph_op=args.graph_op)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def require_files(**paths: Path | None) -> None:
    """Every input file a flag names exists (flag name -> path; None: not given), checked
    before a model is loaded or a backend measured: a typo should not cost the user those
    seconds before it is reported."""
    missing = [f"--{flag.replace('_', '-')} {path}" for flag, path in paths.items()
               if path is not None and not Path(path).is_file()]
    if missing:
        raise UserError(f"no such file: {', '.join(missing)}; check the path (relative ones "
                        f"are relative to {Path.cwd()})")
