"""System samples every interval, with the same field names whatever the machine offers.

GPU fields come from tegrastats (Jetson), else NVML, else Jetson sysfs; CPU, RAM, swap and
the daemon's RSS from psutil. Every sample has every key of `SAMPLE_FIELDS` (None when
unavailable), and the caller never waits on a source.
"""

from __future__ import annotations

import glob
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from stgcnd.log import get_logger
from stgcnd.threadname import name_os_thread

log = get_logger(__name__)

SAMPLE_FIELDS = (
    "source",  # tegrastats | nvml | sysfs | none
    "cpu_pct", "cpu_freq_mhz", "ram_used_mb", "ram_total_mb", "swap_used_mb", "swap_total_mb",
    "rss_mb",
    "gpu_load_pct", "gpu_freq_mhz", "gpu_mem_used_mb", "gpu_mem_total_mb", "gpu_temp_c",
    "emc_load_pct", "emc_freq_mhz",
    "temp_max_c", "temps_c", "power_total_mw", "power_mw",
    "tegrastats_age_s", "tegrastats_restarts",
)

BACKOFF_START_S = 0.5  # tegrastats' restarts (telemetry/tegrastats.py)
# Rails that measure the whole module/board input; when none is present the total is the sum.
TOTAL_POWER_RAILS = ("VDD_IN", "POM_5V_IN", "VIN")
# A sensor that reports a fixed placeholder (100 C on TX2/Nano/Xavier), never a measurement.
PLACEHOLDER_SENSORS = frozenset({"PMIC"})


# Sources, first available wins for the GPU fields:
#
# 1. ``tegrastats`` (Jetson): a child process ``tegrastats --interval <ms>`` read line by line in
#    a reader thread; the latest parsed line is kept. If it exits it is restarted with exponential
#    backoff (0.5 s doubling to 30 s, reset once it has run for a minute). The caller never waits
#    on it.
# 2. NVML through ``pynvml`` (``pip install stgcnd[nvml]``) on discrete NVIDIA GPUs.
# 3. Jetson sysfs: GPU devfreq ``load``/``cur_freq`` and thermal zones, when tegrastats is absent.
class _Nvml:
    """Device 0 through NVML; `available` is False when pynvml or a driver is missing."""

    def __init__(self) -> None:
        self.available = False
        try:
            import pynvml  # optional extra `nvml`
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no driver, no device: fall back quietly
            return
        self._nv = pynvml
        self.available = True

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except Exception:
            return None

    def sample(self) -> dict[str, Any]:
        nv = self._nv
        util = self._try(nv.nvmlDeviceGetUtilizationRates)
        mem = self._try(nv.nvmlDeviceGetMemoryInfo)
        temp = self._try(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        power = self._try(nv.nvmlDeviceGetPowerUsage)
        return {
            "gpu_load_pct": util.gpu if util is not None else None,
            "gpu_freq_mhz": self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_GRAPHICS),
            "gpu_mem_used_mb": round(mem.used / 2**20, 1) if mem is not None else None,
            "gpu_mem_total_mb": round(mem.total / 2**20, 1) if mem is not None else None,
            "gpu_temp_c": temp,
            "emc_load_pct": util.memory if util is not None else None,
            "emc_freq_mhz": self._try(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "temps_c": {"gpu": temp} if temp is not None else None,
            "power_total_mw": power,
            "power_mw": {"gpu": power} if power is not None else None,
        }

    def close(self) -> None:
        if self.available:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass


# GPU devfreq nodes across Jetson generations (Nano gpu, TX2 gp10b, Xavier gv11b, Orin ga10b,
# Thor gb10b); matched by name so new SoCs with the same naming keep working.
_GPU_DEVFREQ_HINTS = ("gpu", "gp10b", "gv11b", "ga10b", "gb10b")


class _JetsonSysfs:
    """GPU load/frequency and thermal zones straight from sysfs (no root needed)."""

    def __init__(self, root: str = "/") -> None:
        self.root = Path(root)
        self.devfreq = self._find_devfreq()
        self.zones = sorted(glob.glob(str(self.root / "sys/class/thermal/thermal_zone*")))
        self.available = self.devfreq is not None

    def _find_devfreq(self) -> Path | None:
        for node in sorted(glob.glob(str(self.root / "sys/class/devfreq/*"))):
            name = os.path.basename(node).lower()
            if any(hint in name for hint in _GPU_DEVFREQ_HINTS):
                return Path(node)
        return None

    @staticmethod
    def _read_int(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.devfreq is not None:
            freq_hz = self._read_int(self.devfreq / "cur_freq")
            out["gpu_freq_mhz"] = round(freq_hz / 1e6) if freq_hz is not None else None
            # `load` sits on the GPU device itself (devfreq's `device` link), in per mille.
            load = self._read_int(self.devfreq / "device" / "load")
            out["gpu_load_pct"] = round(load / 10, 1) if load is not None else None
        temps: dict[str, float | None] = {}
        for zone in self.zones:
            try:
                name = Path(zone, "type").read_text().strip()
            except OSError:
                continue
            milli = self._read_int(Path(zone) / "temp")
            value = None if milli is None or milli <= -256000 else milli / 1000
            temps[_strip_suffix(_strip_suffix(name, "-thermal"), "-therm")] = value
        if temps:
            out["temps_c"] = temps
            out["gpu_temp_c"] = gpu_temperature_c(temps)
        return out


class SystemSampler:
    """Emits one system-sample dict every `interval_s` seconds from a background thread.

    `emit` is called from the sampler thread; an exception in it is logged, never fatal.
    `tegrastats_path`: the executable to run (tests pass a stand-in); None looks for
    `tegrastats` on PATH and falls back to NVML, then Jetson sysfs, when it is not there.
    """

    def __init__(self, interval_s: float, emit: Callable[[dict[str, Any]], None],
                 tegrastats_path: str | None = None, *, use_nvml: bool = True,
                 sysfs_root: str = "/", backoff_start_s: float = BACKOFF_START_S) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.emit = emit
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        path = tegrastats_path or shutil.which("tegrastats")
        self.tegrastats = None
        if path:  # a Jetson: only there is the parser loaded
            from stgcnd.telemetry.tegrastats import TegrastatsReader

            self.tegrastats = TegrastatsReader(path, max(1, round(interval_s * 1000)),
                                               backoff_start_s=backoff_start_s)
        self._nvml = _Nvml() if self.tegrastats is None and use_nvml else None
        self._sysfs: _JetsonSysfs | None = None
        if self.tegrastats is None and not (self._nvml and self._nvml.available):
            sysfs = _JetsonSysfs(sysfs_root)
            self._sysfs = sysfs if sysfs.available else None
        # Prime psutil's CPU counters so the first sample is a real percentage.
        psutil.cpu_percent(None)

    @property
    def source(self) -> str:
        if self.tegrastats is not None:
            return "tegrastats"
        if self._nvml is not None and self._nvml.available:
            return "nvml"
        if self._sysfs is not None:
            return "sysfs"
        return "none"

    def start(self) -> None:
        if self._thread is not None:
            return
        if self.tegrastats is not None:
            self.tegrastats.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="stgcnd-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.tegrastats is not None:
            self.tegrastats.stop(timeout)
        if self._nvml is not None:
            self._nvml.close()

    def _loop(self) -> None:
        name_os_thread("stgcnd-sampler")
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval_s
            # After a long stall (suspend, debugger) skip missed ticks instead of bursting.
            if next_at < time.monotonic():
                next_at = time.monotonic() + self.interval_s
            try:
                self.emit(self.sample_once())
            except Exception as exc:
                log.error("system_sample_failed", error=repr(exc))

    def sample_once(self) -> dict[str, Any]:
        sample: dict[str, Any] = dict.fromkeys(SAMPLE_FIELDS)
        sample["source"] = self.source
        self._sample_host(sample)
        if self.tegrastats is not None:
            self._sample_tegrastats(sample)
        elif self._nvml is not None and self._nvml.available:
            sample.update(self._nvml.sample())
        elif self._sysfs is not None:
            sample.update(self._sysfs.sample())
        if sample["temp_max_c"] is None:
            sample["temp_max_c"] = hottest_c(sample["temps_c"])
        return sample

    def _sample_host(self, sample: dict[str, Any]) -> None:
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        sample["cpu_pct"] = psutil.cpu_percent(None)
        try:
            freq = psutil.cpu_freq()
        except Exception:  # some containers have no cpufreq
            freq = None
        sample["cpu_freq_mhz"] = round(freq.current) if freq else None
        sample["ram_used_mb"] = round((vm.total - vm.available) / 2**20, 1)
        sample["ram_total_mb"] = round(vm.total / 2**20, 1)
        sample["swap_used_mb"] = round(sw.used / 2**20, 1)
        sample["swap_total_mb"] = round(sw.total / 2**20, 1)
        sample["rss_mb"] = round(self._process.memory_info().rss / 2**20, 1)

    def _sample_tegrastats(self, sample: dict[str, Any]) -> None:
        assert self.tegrastats is not None
        sample["tegrastats_restarts"] = self.tegrastats.restarts
        line, age = self.tegrastats.latest()
        if line is None:
            return
        sample["tegrastats_age_s"] = round(age, 3) if age is not None else None
        for key in ("gpu_load_pct", "gpu_freq_mhz", "emc_load_pct", "emc_freq_mhz",
                    "temps_c", "power_mw"):
            sample[key] = line.get(key)
        cores = [c["freq_mhz"] for c in line.get("cpu") or [] if c and c.get("freq_mhz")]
        if cores:
            sample["cpu_freq_mhz"] = max(cores)
        sample["gpu_temp_c"] = gpu_temperature_c(line.get("temps_c"))
        sample["power_total_mw"] = total_power_mw(line.get("power_mw"))


def _strip_suffix(text: str, suffix: str) -> str:
    """str.removesuffix, which is Python 3.9+ (JetPack 5 runs 3.8)."""
    return text[:-len(suffix)] if suffix and text.endswith(suffix) else text


def total_power_mw(power_mw: dict[str, int] | None) -> int | None:
    """Board input power: the input rail when tegrastats reports one, else the sum of all rails.

    The sum is what Xavier, AGX Orin and Thor offer (no input rail); it leaves out carrier-board
    consumers, so it reads lower than a meter at the wall.
    """
    if not power_mw:
        return None
    for rail in TOTAL_POWER_RAILS:
        if rail in power_mw:
            return power_mw[rail]
    return sum(power_mw.values())


def gpu_temperature_c(temps_c: dict[str, float | None] | None) -> float | None:
    """The GPU sensor (``GPU``/``gpu``) when it reads a temperature."""
    for name, value in (temps_c or {}).items():
        if name.lower() == "gpu" and value is not None:
            return value
    return None


def hottest_c(temps_c: dict[str, float | None] | None) -> float | None:
    """Hottest real sensor, leaving out placeholders such as ``PMIC@100C``."""
    values = [v for k, v in (temps_c or {}).items()
              if v is not None and k not in PLACEHOLDER_SENSORS]
    return max(values) if values else None
