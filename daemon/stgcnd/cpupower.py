"""What the CPU's power management does to a request that arrives after an idle gap.

At 25 Hz every thread on a request's path sleeps long enough for its core to idle deeply and
clock down, which adds to a round trip (docs/performance.md, "The floor"). This reads the
cpuidle states and cpufreq governor of cpu0 from sysfs for `stgcnd doctor` and the `ready` log
line. Reading it changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.fsutil import parse_int, read_system_file

# An idle state whose exit takes longer than this is worth a hint: it is several times what
# the daemon itself spends on a request between receipt and launch.
DEEP_EXIT_US = 100

CPU0 = Path("sys/devices/system/cpu/cpu0")
CPUIDLE = Path("sys/devices/system/cpu/cpuidle")


def idle_states(root: Path = Path("/")) -> list[dict[str, Any]]:
    """cpu0's idle states, shallowest first: name, exit latency (us), disabled."""
    base = root / CPU0 / "cpuidle"
    states = []
    for index in range(64):
        state = base / f"state{index}"
        name = read_system_file(state / "name")
        if name is None:
            break
        states.append({"name": name, "exit_us": parse_int(read_system_file(state / "latency")),
                       "disabled": read_system_file(state / "disable") == "1"})
    return states


def cpu_power(root: Path = Path("/")) -> dict[str, Any]:
    """The idle driver and states, the frequency governor and range of cpu0 (kHz), and
    hints: what to change where a setting is likely to cost a sparse request latency."""
    states = idle_states(root)
    enabled = [s["exit_us"] for s in states if not s["disabled"] and s["exit_us"] is not None]
    freq = root / CPU0 / "cpufreq"
    out: dict[str, Any] = {
        "idle_driver": read_system_file(root / CPUIDLE / "current_driver"),
        "idle_states": states,
        "deepest_exit_us": max(enabled) if enabled else None,
        "governor": read_system_file(freq / "scaling_governor"),
        "min_khz": parse_int(read_system_file(freq / "scaling_min_freq")),
        "max_khz": parse_int(read_system_file(freq / "scaling_max_freq")),
        "hints": [],
    }
    deepest = out["deepest_exit_us"]
    if deepest is not None and deepest > DEEP_EXIT_US:
        out["hints"].append(
            f"cores may sleep in idle states that take up to {deepest} us to leave, and a "
            "camera's request arrives after 40 ms of idling: hold a PM QoS request "
            "(/dev/cpu_dma_latency) or disable the deep states while serving, at some cost in "
            "power (docs/jetson.md, \"Latency at a camera's rate\")")
    low, high = out["min_khz"], out["max_khz"]
    if low is not None and high is not None and low < high and out["governor"] != "performance":
        out["hints"].append(
            f"cores clock down to {low // 1000} MHz when idle ({out['governor']} governor, up to "
            f"{high // 1000} MHz): on a Jetson `sudo jetson_clocks` holds them at the maximum, "
            "at some cost in power (docs/jetson.md, \"Latency at a camera's rate\")")
    return out


def summary(power: dict[str, Any]) -> dict[str, Any]:
    """The few fields worth one log line."""
    return {"idle_driver": power["idle_driver"], "deepest_exit_us": power["deepest_exit_us"],
            "governor": power["governor"], "min_khz": power["min_khz"],
            "max_khz": power["max_khz"]}
