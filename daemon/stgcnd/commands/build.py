"""`stgcnd build`: export, build or reuse an engine in the engine store; print what it did."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from stgcnd.commands._model_args import add_model_arguments, spec_from_args
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import BUILT_HERE, Artifact, EngineStore
from stgcnd.errors import UserError
from stgcnd.model.reference import load_for_inference
from stgcnd.model.spec import ModelSpec
from stgcnd.provision import first_that_serves
from stgcnd.provision.load import Choice
from stgcnd.server.config import engines_root, load_config
from stgcnd.server.serving_plan import PLATFORMS, Target, serving_plan

# With --config the configuration says what is built, as `serve` would load it: these flags
# would build something else (an artefact `serve` never looks up), so they are refused.
CONFIG_DECIDES = {"backend": "auto", "precision": "fp32", "max_batch": 1, "calibration": None,
                  "workspace_mb": 1024, "opt_level": 3, "int8_mode": "qdq",
                  "layer_info": False, "checkpoint": None, "persons": 1, "frames": 150,
                  "layout": "mediapipe", "motion": "first-difference", "labels": None,
                  "allow_synthetic_calibration": False, "graph_op": "matmul"}


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--backend", default="auto",
                   choices=["auto", "tensorrt", "torch", "onnxruntime"],
                   help="runtime to build for (default: auto = the fastest that runs here; on a "
                        "CPU of the precisions --precision allows, measured once and kept: "
                        "--rebuild measures again)")
    g.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "int8"],
                   help="numeric precision (default: fp32)")
    g.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="device for torch/onnxruntime (tensorrt is always cuda; "
                        "default: cuda for tensorrt, else cpu)")
    g.add_argument("--calibration", type=Path, default=None,
                   help="INT8 calibration windows: .npz/.npy of float arrays (N, 3, T, V, M)")
    g.add_argument("--allow-synthetic-calibration", action="store_true",
                   help="calibrate INT8 on generated skeletons when no --calibration is given")
    g.add_argument("--int8-mode", default="qdq", choices=["qdq", "calibrator"],
                   help="INT8 via a Q/DQ ONNX (default; TensorRT 8.5 and later, and "
                        "onnxruntime) or TensorRT's entropy calibrator (TensorRT <= 10 only)")
    g.add_argument("--engines", "--store", type=Path, default=None,
                   help="engine store directory (default: $STGCND_ENGINE_DIR, else the "
                        "daemon's: systemd StateDirectory, ./engines in a checkout, else "
                        "~/.cache/stgcnd/engines)")
    g.add_argument("--workspace-mb", type=int, default=1024,
                   help="TensorRT builder workspace limit in MiB (default: 1024)")
    g.add_argument("--opt-level", type=int, default=3,
                   help="TensorRT builder optimization level 0-5 (default: 3)")
    g.add_argument("--max-batch", type=int, default=1,
                   help="largest batch; > 1 builds a dynamic batch axis (default: 1)")
    g.add_argument("--layer-info", action="store_true",
                   help="TensorRT: write per-layer JSON (precision, tactics) beside the engine")
    g.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch/onnxruntime (default: 0 = library default)")


def options_from_args(args: argparse.Namespace) -> BuildOptions:
    device = args.device or ("cuda" if args.backend == "tensorrt" else "cpu")
    return BuildOptions(precision=args.precision, max_batch=args.max_batch,
                        workspace_mb=args.workspace_mb, opt_level=args.opt_level,
                        calibration=args.calibration,
                        allow_synthetic_calibration=args.allow_synthetic_calibration,
                        device=device, threads=args.threads, layer_info=args.layer_info,
                        int8_mode=args.int8_mode,
                        # The runners `serve` makes by default ([[models]] cuda_graph, compile;
                        # used on CUDA only): `validate` and the store's check run what serves.
                        cuda_graph=True, compile="auto")


def store_from_args(args: argparse.Namespace) -> EngineStore:
    return EngineStore(engines_root(args.engines))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build (or reuse) an engine in the engine store",
                       description="Export the model to ONNX and build the artefact for a "
                                   "backend, precision and device, or reuse the stored one "
                                   "when nothing it depends on changed. Prints what it did.")
    p.add_argument("--config", type=Path, default=None,
                   help="the daemon's config (stgcnd serve --config): prepare every "
                        "[[models]] entry exactly as `serve` will load it (the model flags "
                        "and builder flags are the configuration's then)")
    p.add_argument("--platform", default="here", choices=PLATFORMS,
                   help="with --config: the machine `serve` will run on, when it is not this "
                        "one: jetson (automatic max_batch 8, the Jetson's TensorRT workspace; "
                        "its GPU unless --device cpu) or other (a GPU only with --device "
                        "cuda). Artefacts the runtimes here cannot build are left to that "
                        "machine; the ONNX export it builds them from is made here. "
                        "(default: here)")
    add_model_arguments(p)
    add_build_arguments(p)
    p.add_argument("--rebuild", action="store_true", help="rebuild even if the stored one is "
                   "current, and with backend auto measure the CPU runtimes again")
    p.add_argument("--no-validate", action="store_true",
                   help="skip the comparison with PyTorch after building")
    p.set_defaults(func=run)


def config_target(args: argparse.Namespace) -> Target:
    """Where the configuration will be served; refuses flags that would build otherwise."""
    given = [name for name, default in CONFIG_DECIDES.items()
             if getattr(args, name, default) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UserError(f"with --config the configuration decides what is built, as `serve` "
                        f"will load it; {flags} would build an artefact `serve` never uses: "
                        "set it in the model's [[models]] section instead, or leave out "
                        "--config")
    return Target.described(args.platform, args.device)


def jobs_from_config(path: Path, args: argparse.Namespace
                     ) -> tuple[list[tuple[ModelSpec, str, BuildOptions]], EngineStore, Target]:
    """[(spec, backend, BuildOptions)] for every model of the daemon's config, as `serve`
    loads it (server/serving_plan.py) on the target machine; the store; the target."""
    config = load_config(path)
    target = config_target(args)
    jobs = []
    for mc in config.models:
        if mc.backend == "noop":
            print(f"note: model {mc.name!r} has backend noop: nothing to build")
            continue
        spec, options = serving_plan(mc, target)
        jobs.append((spec, mc.backend, options))
    return jobs, EngineStore(args.engines or config.engines_dir), target


def describe(artifact: Artifact) -> str:
    m = artifact.manifest
    where = artifact.path or artifact.manifest_path
    size = f", {m['size_bytes'] / 2**20:.1f} MiB" if m.get("size_bytes") else ""
    if artifact.reused and artifact.reason == BUILT_HERE:  # e.g. while auto measured
        head = f"built {artifact.backend} {artifact.precision} {where} (above){size}"
    elif artifact.reused:
        head = f"reused {artifact.backend} {artifact.precision} {where} (built {m.get('built_at')})"
    else:
        head = (f"built {artifact.backend} {artifact.precision} {where} in "
                f"{m.get('build_seconds')} s{size} (reason: {artifact.reason})")
    v = m.get("validation") or {}
    if "top1_agreement" in v:
        head += (f"\n  validated on {v['windows']} synthetic windows: max abs diff "
                 f"{v['max_abs_diff']:.3g}, top-1 agreement {v['top1_agreement']:.1%}")
    elif "skipped" in v:
        head += f"\n  not validated: {v['skipped']}"
    return head


def _preparer(model: object, store: EngineStore, args: argparse.Namespace
              ) -> Callable[[Choice], Artifact]:
    return lambda c: store.prepare(model, c.backend, c.options, validate=not args.no_validate,
                                   rebuild="asked (--rebuild)" if args.rebuild else None)


def run(args: argparse.Namespace) -> int:
    target = Target.this_machine()
    if args.config:
        jobs, store, target = jobs_from_config(args.config, args)
    elif args.platform != "here":
        raise UserError("--platform describes the machine a --config will be served on: "
                        "pass the daemon's config with --config")
    else:
        jobs, store = [(spec_from_args(args), args.backend, options_from_args(args))], \
            store_from_args(args)
    store.remeasure_auto = args.rebuild
    for spec, backend_name, options in jobs:
        model = load_for_inference(spec)
        if not target.here:
            # The runtime is chosen, and the artefact built, by the machine that serves (an
            # artefact is keyed on the device and runtime versions it was built with): what
            # it needs from here is the export it builds from, as torch may be absent there.
            onnx = store.export(model, options.dynamic_batch)
            print(f"exported {onnx} for the {args.platform} machine (batch "
                  f"{options.batch_tag}); it builds its {backend_name} engine from it at "
                  "its first start")
            continue
        # Auto falls back along its chain as `serve` does: what is built is what serves.
        artifact, choice = first_that_serves(model, backend_name, options, store,
                                             _preparer(model, store, args))
        if choice.options.precision != options.precision:
            print(f"note: auto measured {choice.backend} {choice.options.precision} the "
                  f"fastest here (precision {options.precision} allows it); built "
                  f"{choice.options.precision}")
        for note in model.notes:
            print(f"note: {note}")
        print(describe(artifact))
        print(f"  motion stream: {spec.motion}")
    return 0
