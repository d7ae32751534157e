"""cpupower reads what the CPU's idle and frequency management will do to a sparse request."""

from __future__ import annotations

import json
from pathlib import Path

from stgcnd.cpupower import DEEP_EXIT_US, cpu_power, idle_states, summary

REPO = Path(__file__).resolve().parents[1]


def make_sysfs(root: Path, driver: str | None, states: list[tuple[str, int, bool]],
               governor: str | None = None, khz: tuple[int, int] | None = None) -> Path:
    cpu = root / "sys/devices/system/cpu"
    if driver is not None:
        (cpu / "cpuidle").mkdir(parents=True)
        (cpu / "cpuidle/current_driver").write_text(driver + "\n")
    for index, (name, exit_us, disabled) in enumerate(states):
        state = cpu / f"cpu0/cpuidle/state{index}"
        state.mkdir(parents=True)
        (state / "name").write_text(name + "\n")
        (state / "latency").write_text(f"{exit_us}\n")
        (state / "disable").write_text("1\n" if disabled else "0\n")
    if governor is not None:
        freq = cpu / "cpu0/cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_governor").write_text(governor + "\n")
        if khz is not None:
            (freq / "scaling_min_freq").write_text(f"{khz[0]}\n")
            (freq / "scaling_max_freq").write_text(f"{khz[1]}\n")
    return root


def test_deep_idle_states_and_clocking_down_each_get_a_hint(tmp_path):
    root = make_sysfs(tmp_path, "psci_idle", [("WFI", 0, False), ("C7", 2000, False)],
                      "schedutil", (115200, 1984000))
    power = cpu_power(root)
    assert power["idle_driver"] == "psci_idle"
    assert [s["name"] for s in power["idle_states"]] == ["WFI", "C7"]
    assert power["deepest_exit_us"] == 2000
    assert power["governor"] == "schedutil"
    assert (power["min_khz"], power["max_khz"]) == (115200, 1984000)
    idle_hint, freq_hint = power["hints"]
    assert "up to 2000 us" in idle_hint and "/dev/cpu_dma_latency" in idle_hint
    assert "115 MHz" in freq_hint and "jetson_clocks" in freq_hint


def test_disabled_deep_states_and_pinned_clocks_need_no_hint(tmp_path):
    # What holding cores shallow and jetson_clocks leave behind: nothing to warn of.
    root = make_sysfs(tmp_path, "psci_idle", [("WFI", 0, False), ("C7", 2000, True)],
                      "schedutil", (1984000, 1984000))
    power = cpu_power(root)
    assert power["deepest_exit_us"] == 0
    assert power["idle_states"][1]["disabled"] is True
    assert power["hints"] == []


def test_the_threshold_is_the_exit_latency_not_the_state_count(tmp_path):
    states = [("POLL", 0, False), ("C1", 2, False), ("C1E", DEEP_EXIT_US, False)]
    assert cpu_power(make_sysfs(tmp_path / "a", "intel_idle", states))["hints"] == []
    states.append(("C6", DEEP_EXIT_US + 1, False))
    assert len(cpu_power(make_sysfs(tmp_path / "b", "intel_idle", states))["hints"]) == 1


def test_a_performance_governor_is_not_clocking_down(tmp_path):
    root = make_sysfs(tmp_path, None, [], "performance", (800000, 3000000))
    assert cpu_power(root)["hints"] == []


def test_nothing_reported_is_none_not_an_error(tmp_path):
    # Containers and some VMs expose no cpuidle or cpufreq (the H100 host's driver: "none").
    power = cpu_power(tmp_path)
    assert idle_states(tmp_path) == []
    assert summary(power) == {"idle_driver": None, "deepest_exit_us": None, "governor": None,
                              "min_khz": None, "max_khz": None}
    assert power["hints"] == []


def test_doctor_prints_the_states_and_the_hints(tmp_path, stgcnd_main):
    root = make_sysfs(tmp_path / "root", "psci_idle", [("WFI", 0, False), ("C7", 2000, False)],
                      "schedutil", (115200, 1984000))
    env = {"STGCND_ENGINE_DIR": str(tmp_path / "engines")}
    proc = stgcnd_main("doctor", "--root", str(root), env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "cpu idle    psci_idle: WFI 0 us, C7 2000 us" in proc.stdout
    assert "cpu freq    schedutil, 115-1984 MHz" in proc.stdout
    assert proc.stdout.count("  LATENCY   ") == 2
    report = json.loads(stgcnd_main("doctor", "--json", "--root", str(root), env=env,
                                    cwd=REPO).stdout)
    assert report["cpu_power"]["deepest_exit_us"] == 2000
