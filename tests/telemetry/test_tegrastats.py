"""The parser on real tegrastats lines; expected values were read off the lines by hand."""

from __future__ import annotations

import random

import pytest

from stgcnd.telemetry.sampler import hottest_c, total_power_mw
from stgcnd.telemetry.tegrastats import parse_line

from .conftest import DATA


def lines(name: str) -> list[str]:
    return [line for line in (DATA / name).read_text().splitlines() if line.strip()]


ALL_LINES = [(path.name, i, line) for path in sorted(DATA.glob("*.txt"))
             for i, line in enumerate(lines(path.name))]


@pytest.mark.parametrize(("name", "index", "line"), ALL_LINES,
                         ids=[f"{n}:{i}" for n, i, _ in ALL_LINES])
def test_every_recorded_line_parses_completely(name, index, line):
    result = parse_line(line)
    assert result["ok"] is True
    assert "unrecognised" not in result, result.get("unrecognised")
    assert result["ram_used_mb"] <= result["ram_total_mb"]
    assert result["cpu"]


# (file, ram used/total, cores, gpu load, gpu MHz, emc load, emc MHz) from the first line.
FIRST_LINES = [
    ("tx1_l4t24_root.txt", 1104, 3995, 4, 0, 998, 0, 1600),
    ("tx1_l4t28_1.txt", 3468, 3983, 4, 3, 76, 1, 408),
    ("tx2_jp3_root.txt", 1685, 7854, 6, 0, 140, 0, 1866),
    ("tx2_jp4_user.txt", 2020, 7852, 6, 0, None, 0, None),
    ("nano_jp461_root.txt", 1923, 3964, 4, 0, 76, 0, 1600),
    ("xavier_agx_jp42_user.txt", 14700, 15692, 8, 0, None, 0, None),
    ("xavier_nx_jp411_root.txt", 5246, 7771, 6, 0, 1109, 2, 1600),
    ("xavier_nx_jp512.txt", 3168, 6851, 6, 0, 114, 2, 204),
    ("agx_orin_jp5.txt", 4321, 62801, 12, 0, 0, 0, 2133),
    ("agx_orin_jp6_r36_4_4.txt", 18207, 62841, 12, 0, 0, 3, 2133),
    ("agx_orin_jp7_r39_2.txt", 4714, 62878, 12, 0, 0, 2, 2133),
    ("thor_jp7_r38_4.txt", 4208, 125773, 14, None, 0, 0, 665),
    ("thor_jp7_r39_2.txt", 9101, 125811, 14, None, 314, 7, 3200),
]


@pytest.mark.parametrize(("name", "used", "total", "cores", "gpu_load", "gpu_mhz", "emc_load",
                          "emc_mhz"), FIRST_LINES, ids=[f[0] for f in FIRST_LINES])
def test_first_line_fields(name, used, total, cores, gpu_load, gpu_mhz, emc_load, emc_mhz):
    r = parse_line(lines(name)[0])
    assert (r["ram_used_mb"], r["ram_total_mb"]) == (used, total)
    assert len(r["cpu"]) == cores
    assert r.get("gpu_load_pct") == gpu_load
    assert r.get("gpu_freq_mhz") == gpu_mhz
    assert r.get("emc_load_pct") == emc_load
    assert r.get("emc_freq_mhz") == emc_mhz


def test_tx1_shared_cpu_frequency_applies_to_every_core():
    r = parse_line(lines("tx1_l4t28_1.txt")[1])
    assert r["cpu"] == [{"load_pct": 17, "freq_mhz": 1734}, {"load_pct": 11, "freq_mhz": 1734},
                        {"load_pct": 65, "freq_mhz": 1734}, {"load_pct": 0, "freq_mhz": 1734}]
    assert (r["swap_used_mb"], r["swap_total_mb"], r["swap_cached_mb"]) == (873, 8192, 281)
    assert (r["gpu_load_pct"], r["gpu_freq_mhz"]) == (39, 76)


def test_tx2_unitless_rails_are_milliwatts_and_pmic_is_not_the_hottest():
    r = parse_line(lines("tx2_jp3_root.txt")[1])
    assert r["power_mw"]["VDD_IN"] == 1776
    assert r["power_avg_mw"]["VDD_IN"] == 1853
    assert r["power_mw"]["VDD_DDR"] == 250
    assert r["temps_c"]["PMIC"] == 100
    assert hottest_c(r["temps_c"]) == 41  # BCPU/MCPU/PLL, not the 100 C PMIC placeholder
    assert (r["mts_fg_pct"], r["mts_bg_pct"]) == (0, 0)
    assert total_power_mw(r["power_mw"]) == 1776  # the input rail, not a sum


def test_non_root_output_leaves_out_what_it_does_not_print():
    r = parse_line(lines("tx2_jp4_user.txt")[0])
    for key in ("swap_used_mb", "emc_freq_mhz", "gpu_freq_mhz", "timestamp"):
        assert key not in r
    assert r["power_mw"]["VDD_SYS_GPU"] == 153 and r["power_avg_mw"]["VDD_SYS_GPU"] == 158


def test_xavier_rails_without_input_rail_sum_to_the_total():
    r = parse_line(lines("xavier_agx_jp42_user.txt")[0])
    assert r["power_mw"] == {"GPU": 463, "CPU": 618, "SOC": 2936, "CV": 0, "VDDRQ": 309,
                             "SYS5V": 3306}
    assert total_power_mw(r["power_mw"]) == 463 + 618 + 2936 + 0 + 309 + 3306
    assert r["temps_c"]["GPU"] == 30.5  # a sensor named GPU, not the GPU rail


def test_nano_pom_rails_and_iram():
    r = parse_line(lines("nano_jp461_root.txt")[0])
    assert total_power_mw(r["power_mw"]) == 1750
    assert r["power_avg_mw"]["POM_5V_CPU"] == 406
    assert r["other"]["IRAM"].startswith("0/252kB")


def test_jetpack5_timestamp_mw_rails_and_gpc_list():
    r = parse_line(lines("xavier_nx_jp512.txt")[0])
    assert r["timestamp"] == "2024-07-09T13:31:31"
    assert r["gpu_gpc_freq_mhz"] == [114]
    assert r["power_mw"]["VDD_IN"] == 2763 and r["power_avg_mw"]["VDD_IN"] == 2846


def test_minus_256_sensors_are_null_not_temperatures():
    r = parse_line(lines("agx_orin_jp5.txt")[0])
    for name in ("CV0", "CV1", "CV2", "GPU"):
        assert r["temps_c"][name] is None
    assert r["temps_c"]["CPU"] == 44.562
    assert r["temps_c"]["tj"] == 44.343
    assert hottest_c(r["temps_c"]) == 44.562
    assert r["gpu_gpc_freq_mhz"] == [0, 0]


def test_jetpack6_lower_case_sensors_and_engines():
    r = parse_line(lines("agx_orin_jp6_r36_4_4.txt")[1])
    assert r["timestamp"] == "2026-05-09T18:42:07"
    assert r["temps_c"] == {"cpu": 52.343, "soc2": 48.343, "soc0": 49.062, "tj": 52.343,
                            "soc1": 49.531}
    assert r["engines"]["NVENC"] == {"load_pct": 78, "freq_mhz": 166}
    assert r["engines"]["NVDEC"] == {"off": True}
    assert r["power_mw"]["VIN_SYS_5V0"] == 4607 and r["power_avg_mw"]["VIN_SYS_5V0"] == 4657
    assert r["cpu"][7] == {"load_pct": 40, "freq_mhz": 1036}


def test_jetpack7_orin_off_cores_pairs_and_triples():
    r = parse_line(lines("agx_orin_jp7_r39_2.txt")[0])
    assert r["cpu"][:2] == [{"load_pct": 78, "freq_mhz": 1728}, {"load_pct": 33, "freq_mhz": 1728}]
    assert r["cpu"][8:] == [None, None, None, None]
    assert r["temps_c"]["soc1"] == 49 and r["temps_max_c"]["soc1"] == 49
    assert r["power_max_mw"]["VDD_CPU_CV"] == 2643
    assert r["gpu_load_pct"] == 0  # Orin keeps utilisation on JetPack 7


def test_thor_gpu_without_utilisation_and_three_value_rails():
    r = parse_line(lines("thor_jp7_r39_2.txt")[1])
    assert "gpu_load_pct" not in r
    assert r["gpu_freq_mhz"] == 314 and r["gpu_gpc_freq_mhz"] == [314, 314, 314]
    assert r["power_mw"]["VDD_CPU_SOC_MSS"] == 7953
    assert r["power_avg_mw"]["VDD_CPU_SOC_MSS"] == 8332
    assert r["power_max_mw"]["VDD_CPU_SOC_MSS"] == 8710
    assert r["temps_c"]["cpu"] == 34.312 and r["temps_max_c"]["cpu"] == 34.843
    assert r["temps_c"]["gpu"] == 35.906
    assert r["engines"]["VIC"] == {"load_pct": 59, "freq_mhz": 423}
    assert r["engines"]["NVENC0_FREQ"] == {"freq_mhz": 1556}
    assert r["engines"]["PVA0_FREQ"] == {"off": True}
    assert total_power_mw(r["power_mw"]) == 4925 + 7953 + 6667


def test_thor_r38_two_value_rails():
    r = parse_line(lines("thor_jp7_r38_4.txt")[1])
    assert r["power_mw"] == {"VDD_GPU": 0, "VDD_CPU_SOC_MSS": 4923, "VIN_SYS_5V0": 4327}
    assert "power_max_mw" not in r
    assert r["cpu"][9] == {"load_pct": 17, "freq_mhz": 2601}
    assert r["gpu_gpc_freq_mhz"] == [0, 0, 0]


@pytest.mark.parametrize("text", [
    "", "   ", "hello world", "RAM", "RAM x/yMB", "\x00\x01\x02 binary", "{\"event\": \"x\"}",
    "tegrastats: command not found", "Segmentation fault (core dumped)",
])
def test_lines_that_are_not_tegrastats_are_reported_not_raised(text):
    r = parse_line(text)
    assert r["ok"] is False
    assert r["error"]


def test_unknown_tokens_are_kept_raw():
    r = parse_line("RAM 10/20MB CPU [1%@2] FUTURE_TOKEN ?? GR3D_FREQ 5%")
    assert r["ok"] is True
    assert r["unrecognised"] == ["FUTURE_TOKEN", "??"]
    assert r["gpu_load_pct"] == 5


def test_truncated_and_mangled_real_lines_never_raise():
    rng = random.Random(6)
    for _, _, line in ALL_LINES:
        for _ in range(40):
            cut = line[: rng.randrange(len(line) + 1)]
            mangled = "".join(c for c in cut if rng.random() > 0.05)
            for text in (cut, mangled):
                r = parse_line(text)
                assert isinstance(r["ok"], bool)
