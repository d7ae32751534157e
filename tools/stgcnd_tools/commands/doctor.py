"""`stgcnd doctor`: what this machine has for stgcnd (versions, CUDA, TensorRT, Jetson, store)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

from stgcnd import __version__
from stgcnd.board import detect
from stgcnd.cpupower import cpu_power
from stgcnd.engines.device import gpu_identity
from stgcnd.engines.store import EngineStore
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.runtimes import available, import_tensorrt, import_torch
from stgcnd.runtimes.free_memory import free_memory
from stgcnd.runtimes.tensorrt_runtime import missing_api
from stgcnd.server.config import Config, load_config
from stgcnd.server.models import memory_plan_for
from stgcnd.versions import module_version
from stgcnd_tools.doctor.checks import jetson_stack, run_checks
from stgcnd_tools.doctor.unit import INSTALLED_UNIT, find_unit, unit_checks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="report versions, GPU, TensorRT, Jetson and engine store",
                       description="Report what stgcnd can use on this machine: Python and "
                                   "library versions, CUDA GPU, TensorRT, Jetson module / L4T "
                                   "/ JetPack, backends, and the engine store.")
    p.add_argument("--engines", "--store", dest="store", type=Path, default=None,
                   help="engine store directory to inspect")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="the daemon's configuration, read as `stgcnd serve` reads it (default: "
                        "$STGCND_CONFIG, else /etc/stgcnd/stgcnd.toml, else the defaults): its "
                        "memory_reserve_mb and memory_budget_mb make the memory budget, its "
                        "engines_dir the store, its endpoints and MQTT broker what the unit "
                        "must let through")
    p.add_argument("--unit", type=Path, nargs="?", default=None, const=Path(INSTALLED_UNIT),
                   metavar="PATH",
                   help="check this systemd unit file (and its drop-ins) before its first "
                        "start: the device nodes CUDA opens, its user and groups, its address "
                        "filter against the configuration (default: /" + INSTALLED_UNIT +
                        ", which is checked without this flag too once installed)")
    # Where to read the Jetson's files from (/etc/nv_tegra_release, the dpkg database,
    # /usr/local/cuda, the CPU's sysfs): for tests and for inspecting a mounted root filesystem.
    p.add_argument("--root", type=Path, default=Path("/"),
                   help="read the Jetson's files (etc/nv_tegra_release, dpkg status, CUDA "
                        "version) and the CPU's idle and clock settings (sys/) under this "
                        "directory, e.g. a board's mounted root file system (default: /)")
    p.add_argument("--smoke-test", action="store_true",
                   help="also build a one-layer TensorRT engine, load it and run it once "
                        "through the CUDA driver, comparing its output (takes seconds; needs "
                        "tensorrt to import); exit status 1 when it fails")
    p.set_defaults(func=run)


def _torch_cuda() -> dict[str, Any]:
    try:
        torch = import_torch()
    except BackendUnavailable:
        return {"available": False, "reason": "torch not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "torch_cuda": torch.version.cuda}
    major, minor = torch.cuda.get_device_capability(0)
    free, total = torch.cuda.mem_get_info(0)
    return {"available": True, "torch_cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
            "memory_total_mb": total // 2**20, "memory_free_mb": free // 2**20,
            "cudnn": torch.backends.cudnn.version()}


def _tensorrt() -> dict[str, Any]:
    out: dict[str, Any] = {"tensorrt": module_version("tensorrt")}
    if out["tensorrt"]:
        try:
            missing = missing_api(import_tensorrt())
            out["tensorrt_api"] = "ok" if not missing else f"lacks {', '.join(missing)}"
        except Exception as exc:
            out["tensorrt_api"] = str(exc)
    return out


def _driver(config: Config) -> dict[str, Any]:
    """The GPU through the CUDA driver (the daemon's one CUDA layer): free memory now and
    the models' budget, computed as the daemon's memory plan computes them at start
    (server.models.memory_plan_for: MemAvailable on a Jetson, less the configuration's
    memory_reserve_mb, within its memory_budget_mb)."""
    try:
        plan = memory_plan_for(config.server)
        source = free_memory(plan.reserve).source
    except Exception as exc:
        return {"available": False, "reason": str(exc)}
    mb = 2**20
    return {"available": True, "memory_free_mb": plan.free_at_start // mb,
            "memory_total_mb": plan.total // mb, "reserve_mb": plan.reserve // mb,
            "for_models_mb": plan.budget // mb,
            "budget_mb": config.server.memory_budget_mb, "source": source}


def _store(path: Path) -> dict[str, Any]:
    try:
        store = EngineStore(path)
        entries = store.list()
    except Exception as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, "root": str(store.root), "artefacts": len(entries),
            "entries": entries}


def _config(path: Path | None) -> tuple[Config, dict[str, Any]]:
    """The daemon's configuration (its defaults where it does not load, said in the report)."""
    try:
        config = load_config(path)
    except UserError as exc:
        return Config(), {"source": str(path or "the default configuration"),
                          "error": str(exc)}
    return config, {"source": config.source}


def collect(store: Path | None = None, root: Path = Path("/"), smoke_test: bool = False,
            config_path: Path | None = None, unit: Path | None = None) -> dict[str, Any]:
    gpu = gpu_identity()
    jetson = jetson_stack(root)
    config, config_report = _config(config_path)
    checks = run_checks(root, smoke=smoke_test)
    unit_path = find_unit(root, None if unit is None else
                          root / INSTALLED_UNIT if unit == Path(INSTALLED_UNIT) else unit)
    if unit_path is not None:
        live = root.resolve() == Path("/").resolve()
        checks += unit_checks(unit_path, root, config, live, detect(root).l4t or None)
    return {
        "config": config_report,
        "stgcnd": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "versions": {n: module_version(n) for n in
                     ("numpy", "torch", "onnx", "onnxruntime", "zmq", "msgspec", "structlog")},
        "gpu": gpu,
        "driver": _driver(config) if gpu else {"available": False, "reason": "no GPU"},
        "cuda": _torch_cuda(),
        "tensorrt": _tensorrt(),
        "jetson": jetson,
        # On a Jetson: power mode, clocks, memory, tegrastats, the driver; and the TensorRT
        # smoke test when asked for. Each {name, status, detail, fix} (doctor_checks.py).
        "checks": checks,
        "cpu_power": cpu_power(root),
        "backends": {k: v or "ok" for k, v in available().items()},
        "store": _store(store or config.engines_dir),
    }


def run(args: argparse.Namespace) -> int:
    report = collect(args.store, args.root, smoke_test=args.smoke_test,
                     config_path=args.config, unit=args.unit)
    # Exit status 1 where the smoke test or the unit fails: a script installing the unit
    # stops before its first start.
    failed = any((c["name"] == "tensorrt smoke test" or c["name"].startswith("unit"))
                 and c["status"] == "fail" for c in report["checks"])
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 1 if failed else 0
    v = report["versions"]
    print(f"stgcnd      {report['stgcnd']}")
    print(f"python      {report['python']}")
    print(f"platform    {report['platform']}")
    cfg = report["config"]
    print(f"config      {cfg['source']}" + (f": UNREADABLE, the defaults are used: "
                                             f"{cfg['error']}" if cfg.get("error") else ""))
    for name in ("numpy", "torch", "onnx", "onnxruntime", "zmq", "msgspec", "structlog"):
        label = "pyzmq" if name == "zmq" else name
        print(f"{label:<11} {v[name] or 'not installed'}")
    cuda = report["cuda"]
    if cuda.get("available"):
        print(f"cuda        {cuda['device']} (sm {cuda['compute_capability']}, "
              f"{cuda['memory_total_mb']} MB, torch CUDA {cuda['torch_cuda']})")
    else:
        gpu = report["gpu"]
        print(f"cuda        {'GPU ' + gpu['name'] if gpu else 'no GPU'} (torch: not available)")
    drv = report["driver"]
    if drv.get("available"):
        budget = (f", within memory_budget_mb {drv['budget_mb']}" if drv["budget_mb"] else "")
        print(f"memory      {drv['memory_free_mb']} MB free of {drv['memory_total_mb']} MB "
              f"({drv['source']}); {drv['for_models_mb']} MB for the models after the "
              f"{drv['reserve_mb']} MB reserve (memory_reserve_mb{budget})")
    trt = report["tensorrt"]
    print(f"tensorrt    {trt['tensorrt'] or 'not importable'}"
          + (f" ({trt['tensorrt_api']})" if trt.get("tensorrt_api") else ""))
    j = report["jetson"]
    if j:
        print(f"jetson      {j.get('module') or 'unknown module'}: L4T {j.get('l4t')}, "
              f"JetPack {j.get('jetpack') or 'unknown'}")
        print(f"  tensorrt  {j.get('tensorrt_python') or 'not importable'}"
              f" (package {j.get('tensorrt_package') or 'not installed'})")
        print(f"  cuda      {j.get('cuda') or 'not found'} ({j.get('cuda_source')})")
        print(f"  python    {j.get('python')}")
        for problem in j.get("problems", []):
            print(f"  MISSING   {problem['what']}\n            fix: {problem['fix']}")
    else:
        print("jetson      not a Jetson")
    _print_checks(report["checks"])
    _print_cpu_power(report["cpu_power"])
    for name, state in report["backends"].items():
        print(f"backend     {name}: {state}")
    s = report["store"]
    if s.get("available"):
        print(f"store       {s['root']}: {s['artefacts']} artefact(s)")
    else:
        print(f"store       unavailable ({s.get('reason')})")
    return 1 if failed else 0


def _print_checks(checks: list[dict[str, Any]]) -> None:
    labels = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    for c in checks:
        print(f"check       {labels.get(c['status'], c['status']):<5} {c['name']}: "
              f"{c['detail']}")
        if c.get("fix"):
            print(f"            fix: {c['fix']}")


def _print_cpu_power(power: dict[str, Any]) -> None:
    states = ", ".join(f"{st['name']} {st['exit_us']} us"
                       + (" (disabled)" if st["disabled"] else "")
                       for st in power["idle_states"])
    print(f"cpu idle    {power['idle_driver'] or 'not reported'}"
          + (f": {states}" if states else ""))
    if power["governor"]:
        span = (f", {power['min_khz'] // 1000}-{power['max_khz'] // 1000} MHz"
                if power["min_khz"] is not None and power["max_khz"] is not None else "")
        print(f"cpu freq    {power['governor']}{span}")
    else:
        print("cpu freq    not reported")
    for hint in power["hints"]:
        print(f"  LATENCY   {hint}")
