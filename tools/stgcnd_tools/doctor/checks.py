"""What `stgcnd doctor` checks on a Jetson, its software stack (`jetson_stack`) and more,
each with its fix.

Every check returns a dict: `name`, `status` (ok, warn, fail, skip), `detail` and `fix`. Files
are read under `root`; binaries and the driver are asked only when `root` is this machine's
own. Reading changes nothing.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Dict

import numpy as np

from stgcnd.board import Board, detect
from stgcnd.engines.builders.tensorrt import network_flags, strongly_typed_only
from stgcnd.fsutil import parse_int, read_system_file
from stgcnd.runtimes import import_tensorrt
from stgcnd.runtimes.cuda import check as cuda_check
from stgcnd.runtimes.cuda import device_properties, libraries, make_current
from stgcnd.runtimes.cuda_batch import DriverCalls, DriverMemory
from stgcnd.runtimes.free_memory import device_memory, meminfo
from stgcnd.runtimes.tensorrt_runtime import tensorrt_logger, version_of
from stgcnd.versions import module_version

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
LOW_AVAILABLE_MB = 2048      # below this, the cameras and the daemon compete for memory
SMALL_BOARD_MB = 8704        # an 8 GB module reports about 7.4 GiB of MemTotal
SMOKE_SHAPE = (1, 3, 4, 4)

Check = Dict[str, Any]  # typing.Dict: evaluated at run time, and 3.8 has no dict[...]


# - power mode: nvpmodel's current mode against the fastest one /etc/nvpmodel.conf defines;
# - clocks: whether jetson_clocks holds the CPU and GPU at the power mode's maximum;
# - memory: MemAvailable, swap and zram from /proc/meminfo and /sys/block/zram*;
# - tegrastats: on PATH or in /usr/bin;
# - the CUDA driver, through stgcnd's ctypes layer (runtimes/cuda.py): GPU, compute capability,
#   free memory;
# - (the systemd unit: unit.py, after these.)
#
# And with `stgcnd doctor --smoke-test`, wherever tensorrt imports: a one-layer network (ReLU on
# a 1x3x4x4 input) built with TensorRT's network API, deserialized and run once through the
# driver layer, its output compared with numpy's.
def check(name: str, status: str, detail: str, fix: str | None = None) -> Check:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


def _under(root: Path, rel: str) -> Path:
    """`rel` under `root`, following symbolic links inside `root` (an absolute link target,
    such as /etc/nvpmodel.conf's, is taken relative to `root`, not to this machine)."""
    path = root / rel
    for _ in range(8):
        if not path.is_symlink():
            break
        target = os.readlink(path)
        path = root / target.lstrip("/") if os.path.isabs(target) else path.parent / target
    return path


def is_live(root: Path) -> bool:
    try:
        return root.resolve() == Path("/")
    except OSError:
        return False


# --- power mode (nvpmodel) -------------------------------------------------------------------

NVPMODEL_CONF = "etc/nvpmodel.conf"
NVPMODEL_STATUS = "var/lib/nvpmodel/status"
_MODE_RE = re.compile(r"^<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>", re.MULTILINE)
_DEFAULT_RE = re.compile(r"^<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", re.MULTILINE)


def parse_nvpmodel_conf(text: str) -> tuple[dict[int, str], int | None]:
    """({mode id: name}, the boot default) from /etc/nvpmodel.conf."""
    modes = {int(m.group(1)): m.group(2) for m in _MODE_RE.finditer(text)}
    default = _DEFAULT_RE.search(text)
    return modes, int(default.group(1)) if default else None


def parse_nvpmodel_query(text: str) -> tuple[str | None, int | None]:
    """(name, id) from `nvpmodel -q`: 'NV Power Mode: MAXN' and the id on a line of its own
    (other lines, such as 'NV Fan Mode:quiet' or NVPM WARN lines, may come first)."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        m = re.search(r"NV Power Mode:\s*(\S+)", line)
        if m:
            ids = [x for x in lines[i + 1:] if x.isdigit()]
            return m.group(1), int(ids[0]) if ids else None
    return None, None


def parse_nvpmodel_status(text: str | None) -> int | None:
    """The mode id from /var/lib/nvpmodel/status ('pmode:0002 fmode:quiet')."""
    m = re.search(r"pmode:\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def fastest_mode(modes: dict[int, str]) -> int | None:
    """The mode that lifts the caps: the one named MAXN (MAXN_SUPER where a board has both),
    whatever its id (on an Orin Nano with the super configuration MAXN_SUPER is not mode 0);
    without one, the mode with the largest wattage in its name."""
    maxn = sorted((not name.upper().endswith("SUPER"), mode) for mode, name in modes.items()
                  if name.upper().startswith("MAXN"))
    if maxn:
        return maxn[0][1]
    watts = {mode: int(m.group(1)) for mode, name in modes.items()
             if (m := re.match(r"(?:MODE_)?(\d+)W", name.upper()))}
    return max(watts, key=lambda mode: watts[mode]) if watts else None


def _nvpmodel_query() -> str | None:
    binary = shutil.which("nvpmodel") or next(
        (p for p in ("/usr/sbin/nvpmodel", "/usr/bin/nvpmodel") if os.path.exists(p)), None)
    if binary is None:
        return None
    try:
        proc = subprocess.run([binary, "-q"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout + proc.stderr


def power_mode(root: Path, live: bool,
               query: Callable[[], str | None] = _nvpmodel_query) -> Check:
    name = "power mode"
    text = read_system_file(_under(root, NVPMODEL_CONF))
    if text is None:
        return check(name, WARN, "/etc/nvpmodel.conf not found: the power modes are unknown",
                     "sudo apt install nvidia-l4t-nvpmodel (it installs /etc/nvpmodel.conf for "
                     "this module), then sudo nvpmodel -q")
    modes, default = parse_nvpmodel_conf(text)
    fastest = fastest_mode(modes)
    current, source = None, ""
    if live:
        current = parse_nvpmodel_query(query() or "")[1]
        source = "nvpmodel -q"
    if current is None:
        current = parse_nvpmodel_status(read_system_file(root / NVPMODEL_STATUS))
        source = "/var/lib/nvpmodel/status"
    if current is None and default is not None:
        current, source = default, "assumed: the DEFAULT of /etc/nvpmodel.conf"

    def label(mode: int | None) -> str:
        return "unknown" if mode is None else f"mode {mode} ({modes.get(mode, '?')})"

    detail = (f"{label(current)} ({source}); fastest {label(fastest)}, "
              f"boot default {label(default)}")
    if fastest is None or current is None:
        return check(name, WARN, detail,
                     "sudo nvpmodel -q says the current mode; /etc/nvpmodel.conf lists the "
                     "modes (< POWER_MODEL ID=N NAME=... >)")
    if current == fastest:
        return check(name, OK, detail)
    return check(name, WARN, detail,
                 f"sudo nvpmodel -m {fastest} (the id of {modes[fastest]} in "
                 "/etc/nvpmodel.conf: ids differ between modules and JetPacks, so read it "
                 "there; nvpmodel may ask to reboot). It draws more power and heat: check the "
                 "cooling")


# --- clocks (jetson_clocks) ------------------------------------------------------------------

CPU_DIR = "sys/devices/system/cpu"
DEVFREQ_DIR = "sys/class/devfreq"
_GPU_DEVFREQ = re.compile(r"(\.gpu|\.ga10b|\.gv11b|\.gp10b|\.gb10b)$")


def cpu_clocks(root: Path) -> list[dict[str, Any]]:
    """Online CPUs with cpufreq: scaling min/max and the hardware maximum (kHz)."""
    cpus = []
    base = root / CPU_DIR
    paths = sorted(base.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:]))
    for cpu in paths:
        if read_system_file(cpu / "online") == "0":
            continue
        low = parse_int(read_system_file(cpu / "cpufreq" / "scaling_min_freq"))
        high = parse_int(read_system_file(cpu / "cpufreq" / "scaling_max_freq"))
        if low is None or high is None:
            continue
        hw_max = parse_int(read_system_file(cpu / "cpufreq" / "cpuinfo_max_freq"))
        cpus.append({"cpu": cpu.name, "min_khz": low, "max_khz": high, "hw_max_khz": hw_max})
    return cpus


def gpu_clocks(root: Path) -> list[dict[str, Any]]:
    """The GPU's devfreq device(s) (17000000.ga10b on Orin with L4T R35, 17000000.gv11b on
    Xavier, 17000000.gpu on R36): min and max frequency (Hz)."""
    gpus = []
    base = root / DEVFREQ_DIR
    for dev in sorted(base.glob("*")) if base.is_dir() else []:
        if not _GPU_DEVFREQ.search(dev.name):
            continue
        low = parse_int(read_system_file(dev / "min_freq"))
        high = parse_int(read_system_file(dev / "max_freq"))
        if low is not None and high is not None:
            gpus.append({"device": dev.name, "min_hz": low, "max_hz": high})
    return gpus


def clocks(root: Path) -> Check:
    name = "clocks"
    cpus, gpus = cpu_clocks(root), gpu_clocks(root)
    if not cpus and not gpus:
        return check(name, WARN, "no cpufreq or GPU devfreq settings readable under /sys",
                     "sudo jetson_clocks --show prints the clocks")
    loose_cpu = [c for c in cpus if c["min_khz"] < c["max_khz"]]
    loose_gpu = [g for g in gpus if g["min_hz"] < g["max_hz"]]
    parts = []
    if cpus:
        top = max(c["max_khz"] for c in cpus) // 1000
        low = min(c["min_khz"] for c in cpus) // 1000
        span = f"held at {top} MHz" if not loose_cpu else f"{low}-{top} MHz"
        hw = max((c["hw_max_khz"] or 0) for c in cpus) // 1000
        capped = f", the power mode caps it below the {hw} MHz hardware maximum" \
            if hw > top else ""
        parts.append(f"CPU ({len(cpus)} online) {span}{capped}")
    for g in gpus:
        gtop, glow = g["max_hz"] // 1_000_000, g["min_hz"] // 1_000_000
        parts.append(f"GPU {g['device']} " + (f"held at {gtop} MHz" if g not in loose_gpu
                                              else f"{glow}-{gtop} MHz"))
    detail = "; ".join(parts)
    if not loose_cpu and not loose_gpu:
        return check(name, OK, "jetson_clocks applied: " + detail)
    return check(name, WARN, "clocks scale down when idle: " + detail,
                 "sudo jetson_clocks holds the CPU, GPU and memory clocks at the power mode's "
                 "maximum until the next boot. For latency only, not required: the first "
                 "request after an idle gap then runs at full clock, at some cost in power")


# --- memory ----------------------------------------------------------------------------------

def zram_devices(root: Path) -> dict[str, int]:
    """{zramN: disksize in bytes} of the configured (non-zero) zram devices."""
    out = {}
    for dev in sorted((root / "sys" / "block").glob("zram*")):
        size = parse_int(read_system_file(dev / "disksize"))
        if size:
            out[dev.name] = size
    return out


def memory(root: Path, board: Board) -> Check:
    name = "memory"
    info = meminfo(read_system_file(root / "proc" / "meminfo"))
    if "MemTotal" not in info or "MemAvailable" not in info:
        return check(name, WARN, "/proc/meminfo unreadable", None)
    gib = 1024 * 1024  # kB per GiB
    total, available = info["MemTotal"], info["MemAvailable"]
    swap, swap_free = info.get("SwapTotal", 0), info.get("SwapFree", 0)
    zram = zram_devices(root)
    zram_gib = sum(zram.values()) / 2**30
    detail = (f"{available / gib:.1f} GiB available of {total / gib:.1f} GiB; swap "
              f"{swap / gib:.1f} GiB ({swap_free / gib:.1f} free); "
              + (f"zram {len(zram)} device(s), {zram_gib:.1f} GiB" if zram else "no zram"))
    problems, fixes = [], []
    if available < LOW_AVAILABLE_MB * 1024:
        problems.append(f"less than {LOW_AVAILABLE_MB // 1024} GiB available")
        fixes.append("free memory before serving (the GPU shares it): stop what the board "
                     "does not need, e.g. the desktop (sudo systemctl set-default "
                     "multi-user.target, then reboot), other models, browsers")
    memory_mb = board.memory_mb or total // 1024
    if swap == 0 and not zram and memory_mb <= SMALL_BOARD_MB:
        problems.append("no swap and no zram on a board of 8 GB or less")
        fixes.append("enable JetPack's compressed swap in RAM: sudo systemctl enable --now "
                     "nvzramconfig (or add a swap file), so that a peak does not end in the "
                     "out-of-memory killer")
    if not problems:
        return check(name, OK, detail)
    return check(name, WARN, "; ".join(problems) + ": " + detail, "; ".join(fixes))


# --- tegrastats ------------------------------------------------------------------------------

def tegrastats(root: Path, live: bool) -> Check:
    name = "tegrastats"
    found = shutil.which("tegrastats") if live else None
    if found is None and (root / "usr" / "bin" / "tegrastats").is_file():
        found = "/usr/bin/tegrastats"
    if found:
        return check(name, OK, found)
    return check(name, WARN, "tegrastats not found (on PATH or in /usr/bin)",
                 "it ships with JetPack (package nvidia-l4t-tools): sudo apt install "
                 "nvidia-l4t-tools. `stgcnd tegrastats parse` reads its logs")


# --- the CUDA driver -------------------------------------------------------------------------

def cuda_driver(load: Callable[[], object] = libraries,
                properties: Callable[[], dict[str, str] | None] = device_properties,
                memory_now: Callable[[], tuple[int, int]] = device_memory) -> Check:
    """The GPU as the daemon reaches it: libcuda through ctypes (no torch, no toolkit)."""
    name = "cuda driver"
    try:
        load()
    except Exception as exc:
        return check(name, FAIL, str(exc),
                     "libcuda.so.1 comes with L4T, not with the CUDA toolkit: sudo apt install "
                     "--reinstall nvidia-l4t-cuda (then sudo ldconfig); it lives in "
                     "/usr/lib/aarch64-linux-gnu/tegra")
    props = properties()
    if props is None:
        return check(name, FAIL, "libcuda loads, but the driver finds no usable GPU",
                     "run stgcnd as a user in the video group (sudo usermod -aG video $USER, "
                     "then log in again; the systemd unit sets SupplementaryGroups=video), and "
                     "check that tegrastats shows the GPU (GR3D_FREQ)")
    detail = f"{props['name']}, compute capability {props['compute_capability']}"
    try:
        free, total = memory_now()
    except Exception as exc:
        return check(name, FAIL, f"{detail}; memory query failed: {exc}",
                     "reboot the board; if it persists, reinstall nvidia-l4t-cuda")
    return check(name, OK, f"{detail}, {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")


# --- the TensorRT smoke test -----------------------------------------------------------------

class DriverDevice:
    """What the smoke test needs of the CUDA driver layer (runtimes/cuda.py): a stream,
    zeroed device memory, pinned host arrays and the copies between them."""

    def __init__(self) -> None:
        make_current()  # the primary context is current before TensorRT touches CUDA
        self.memory = DriverMemory()
        self.calls = DriverCalls(0)

    def stream(self) -> int:
        return self.memory.stream()

    def zeros(self, nbytes: int, stream: int) -> int:
        return self.memory.device_zeros(nbytes, stream)

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self.memory.pinned(shape, dtype)

    def upload(self, address: int, host: np.ndarray) -> None:
        self.memory.upload(address, host)

    def download(self, host: np.ndarray, address: int, stream: int) -> None:
        cuda_check(self.calls.dtoh(host.ctypes.data, address, host.nbytes, stream),
                   "cuMemcpyDtoHAsync")
        self.memory.synchronize(stream)

    def close(self) -> None:
        self.calls.destroy()
        self.memory.free()


SMOKE_FIX = ("reboot and run stgcnd doctor --smoke-test again; if it still fails, reinstall "
             "JetPack's TensorRT (sudo apt install --reinstall tensorrt python3-libnvinfer) "
             "and send us the output")


def tensorrt_smoke_test(trt: Any, device: Any = None, logger: Any = None) -> Check:
    """Build a one-layer network (ReLU on a 1x3x4x4 float input) with `trt`'s network API,
    deserialize it, create an execution context and run it once on `device` (a DriverDevice,
    made here by default), then compare the output with numpy's ReLU.

    Only names TensorRT 8.5 to 11.x all have are used: create_network with the flags the
    release wants (EXPLICIT_BATCH before 10.x, none in 10.x, STRONGLY_TYPED in 11.x),
    add_input / add_activation / mark_output, set_memory_pool_limit,
    build_serialized_network, deserialize_cuda_engine, create_execution_context,
    set_tensor_address and execute_async_v3."""
    name = "tensorrt smoke test"
    version = version_of(trt)
    x = (np.arange(int(np.prod(SMOKE_SHAPE)), dtype=np.float32) - 20.5).reshape(SMOKE_SHAPE)
    expected = np.maximum(x, 0)
    started = time.monotonic()
    try:
        device = DriverDevice() if device is None else device
    except Exception as exc:
        return check(name, FAIL, f"TensorRT {version}: the CUDA driver is not usable: {exc}",
                     "the GPU must answer through libcuda.so.1 first (on a Jetson: the cuda "
                     "driver check above says what is wrong)")
    try:
        logger = tensorrt_logger(trt) if logger is None else logger
        mark = getattr(logger, "error_count", 0)

        def failed(what: str) -> Check:
            errors: list[str] = getattr(logger, "errors_since", lambda _mark: [])(mark)
            said = f" (TensorRT said: {errors[-1]})" if errors else ""
            return check(name, FAIL, f"TensorRT {version}: {what}{said}", SMOKE_FIX)

        builder = trt.Builder(logger)
        network = builder.create_network(network_flags(trt, strongly_typed_only(trt)))
        config = builder.create_builder_config()
        inp = network.add_input("x", trt.DataType.FLOAT, SMOKE_SHAPE)
        relu = network.add_activation(inp, trt.ActivationType.RELU)
        out = relu.get_output(0)
        out.name = "y"
        network.mark_output(out)
        if hasattr(config, "set_memory_pool_limit"):
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 24)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            return failed("the builder made no engine of a one-layer network")
        built = time.monotonic()
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            return failed("the engine it had just built did not deserialize")
        context = engine.create_execution_context()
        if context is None:
            return failed("no execution context could be created")
        stream = device.stream()
        nbytes = x.nbytes
        d_in, d_out = device.zeros(nbytes, stream), device.zeros(nbytes, stream)
        host_in = device.pinned(SMOKE_SHAPE, np.float32)
        host_out = device.pinned(SMOKE_SHAPE, np.float32)
        host_in[...] = x
        host_out[...] = np.nan  # nothing written shows as a mismatch
        device.upload(d_in, host_in)
        if not (context.set_tensor_address("x", d_in)
                and context.set_tensor_address("y", d_out)):
            return failed("set_tensor_address refused the buffers")
        ran = time.monotonic()
        if not context.execute_async_v3(stream):
            return failed("execute_async_v3 refused to run")
        device.download(host_out, d_out, stream)
        done = time.monotonic()
        got = np.array(host_out)
        if not np.array_equal(got, expected):
            diff = np.abs(np.nan_to_num(got, nan=np.inf) - expected)
            bad = int(np.count_nonzero(diff))
            return check(name, FAIL, f"TensorRT {version}: the engine ran, but {bad} of "
                         f"{got.size} outputs differ from ReLU's (largest difference "
                         f"{float(diff.max()):g})", SMOKE_FIX)
        return check(name, OK, f"TensorRT {version}: built a one-layer ReLU engine "
                     f"({built - started:.1f} s), deserialized it and ran it once on "
                     f"{'x'.join(map(str, SMOKE_SHAPE))} ({(done - ran) * 1000:.1f} ms): "
                     "output matches")
    except Exception as exc:
        return check(name, FAIL, f"TensorRT {version}: {type(exc).__name__}: {exc}", SMOKE_FIX)
    finally:
        # The TensorRT objects go with this frame: an engine keeps its runtime alive and a
        # context its engine (pybind keep_alive in the bindings), so no order is needed.
        try:
            device.close()
        except Exception:
            pass


def smoke_test(import_trt: Callable[[], Any] | None = None) -> Check:
    """The smoke test with this Python's tensorrt, or why it cannot run."""
    try:
        trt = (import_trt or import_tensorrt)()
    except Exception as exc:
        return check("tensorrt smoke test", FAIL, f"not run: {exc}",
                     "on a Jetson, a venv made with --system-site-packages sees JetPack's "
                     "tensorrt (see the jetson lines above); elsewhere install TensorRT's "
                     "Python bindings")
    return tensorrt_smoke_test(trt)


# --- all of them -----------------------------------------------------------------------------

def run_checks(root: Path = Path("/"), smoke: bool = False, live: bool | None = None,
               board: Board | None = None) -> list[Check]:
    """The Jetson checks (none off a Jetson), then the smoke test when asked for."""
    board = detect(root) if board is None else board
    live = is_live(root) if live is None else live
    out: list[Check] = []
    if board.jetson:
        out += [power_mode(root, live), clocks(root), memory(root, board),
                tegrastats(root, live)]
        if live:
            out.append(cuda_driver())
        else:
            out.append(check("cuda driver", SKIP, "not asked: --root is not this machine's root"))
    if smoke:
        out.append(smoke_test())
    return out


# --- the Jetson software stack (for `stgcnd doctor`) ------------------------------------------
#
# Every reader takes the filesystem root (tests use a directory of real-format files), and the
# dpkg database is read from var/lib/dpkg/status instead of running dpkg-query.

# L4T major -> JetPack line and the Python its Ubuntu ships (JetPack's tensorrt bindings are
# built for that Python only). Sources in docs/jetson.md.
JETPACK_BY_L4T_MAJOR = {35: ("5", "3.8"), 36: ("6", "3.10"), 38: ("7", "3.12"),
                        39: ("7", "3.12")}


def dpkg_versions(status_text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of `packages` from a dpkg status database (var/lib/dpkg/status)."""
    found: dict[str, str] = {}
    for stanza in status_text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        name = fields.get("Package")
        if name in packages and "installed" in fields.get("Status", "").split():
            found[name] = fields.get("Version", "")
    return found


def parse_nvcc_version(text: str) -> str | None:
    """'Cuda compilation tools, release 11.4, V11.4.315' -> '11.4.315'."""
    m = re.search(r"release\s+[0-9.]+,\s*V([0-9.]+)", text or "")
    return m.group(1) if m else None


def cuda_toolkit_version(root: Path = Path("/")) -> tuple[str | None, str]:
    """(version, where it was read) of the CUDA toolkit under usr/local/cuda."""
    cuda = root / "usr" / "local" / "cuda"
    try:
        data = json.loads((cuda / "version.json").read_text())
        return str(data["cuda"]["version"]), str(cuda / "version.json")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    nvcc = cuda / "bin" / "nvcc"
    if nvcc.exists():
        try:
            out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        return parse_nvcc_version(out), str(nvcc)
    return None, str(cuda)


def jetson_stack(root: Path = Path("/"), python: str | None = None,
                 modules: dict[str, str | None] | None = None) -> dict[str, Any] | None:
    """What a Jetson has for stgcnd, and what is missing with the fix; None off a Jetson.

    `python` ('3.8') and `modules` ({'tensorrt': '8.5.2.2' or None}) default to this
    interpreter's; tests pass them with a `root` of real-format files.
    """
    board = detect(root)
    if not board.jetson:
        return None
    python = python or platform.python_version()
    if modules is None:
        modules = {"tensorrt": module_version("tensorrt")}
    packages = dpkg_versions(read_system_file(root / "var" / "lib" / "dpkg" / "status") or "",
                             ("nvidia-jetpack", "nvidia-l4t-core", "tensorrt",
                              "python3-libnvinfer", "cuda-toolkit", "libcudnn8", "libcudnn9"))
    l4t = (int(board.l4t.split(".")[0]), board.l4t) if board.l4t else None
    line = JETPACK_BY_L4T_MAJOR.get(l4t[0]) if l4t else None
    cuda, cuda_source = cuda_toolkit_version(root)
    out: dict[str, Any] = {
        "module": board.model or None,
        "l4t": board.l4t,
        "l4t_core": packages.get("nvidia-l4t-core"),
        "jetpack": packages.get("nvidia-jetpack") or (f"{line[0]}.x (from L4T)" if line
                                                      else None),
        "tensorrt_package": packages.get("tensorrt") or packages.get("python3-libnvinfer"),
        "tensorrt_python": modules.get("tensorrt"),
        "cuda": cuda, "cuda_source": cuda_source, "python": python, "problems": [],
    }
    problems: list[dict[str, str]] = out["problems"]
    if l4t is None:
        problems.append({"what": "L4T release unknown (/etc/nv_tegra_release unreadable)",
                         "fix": "check the board was flashed with JetPack (SDK Manager)"})
    elif line is None:
        problems.append({"what": f"L4T R{l4t[0]} is not a JetPack stgcnd knows (5, 6, 7)",
                         "fix": "JetPack 5.1.x (R35), 6.x (R36) or 7.x (R38/R39)"})
    want_python = line[1] if line else None
    if line and want_python and not python.startswith(want_python + ".") and python != want_python:
        problems.append({
            "what": f"Python {python}, but JetPack {line[0]}'s tensorrt bindings are built for "
                    f"Python {want_python}",
            "fix": f"make the venv from the system interpreter: python{want_python} -m venv "
                   "--system-site-packages /opt/stgcnd/venv"})
    if not out["tensorrt_python"]:
        if out["tensorrt_package"]:
            problems.append({
                "what": f"TensorRT {out['tensorrt_package']} is installed but not importable "
                        "from this Python",
                "fix": "recreate the venv with --system-site-packages (JetPack's tensorrt "
                       "lives in /usr/lib/python3/dist-packages)"})
        else:
            problems.append({"what": "TensorRT is not installed",
                             "fix": "sudo apt install nvidia-jetpack (or python3-libnvinfer)"})
    return out
