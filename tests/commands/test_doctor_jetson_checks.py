"""`stgcnd doctor`'s Jetson checks (power mode, clocks, memory, tegrastats, the CUDA driver),
read from a root directory of real-format files for an Orin NX 8 GB on L4T R35.4.1 (JetPack
5.1.2): one board set up for latency, one left as it boots with too little memory free
(tests/commands/data/README.md says where each file's format comes from)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stgcnd.board import Board, detect
from stgcnd.errors import BackendUnavailable
from stgcnd_tools.doctor.checks import (
    clocks,
    cuda_driver,
    fastest_mode,
    memory,
    parse_nvpmodel_conf,
    parse_nvpmodel_query,
    parse_nvpmodel_status,
    power_mode,
    run_checks,
    tegrastats,
)
from tests.commands.test_doctor_jetson import make_root
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"
CONF = "nvpmodel_p3767_0001.conf"
ZRAM_BYTES = 662482944  # nvzramconfig: half of MemTotal over one device per core (6)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def orin_nx_8gb(tmp_path: Path, well_set: bool) -> Path:
    """An Orin NX 8 GB on L4T R35.4.1. Well set: MAXN, jetson_clocks applied, 5.7 GiB
    available, zram swap, tegrastats installed. Badly set: the boot default (15W, cores 4-5
    offline), clocks scaling, 1.4 GiB available, no swap, no tegrastats."""
    root = make_root(tmp_path, "nv_tegra_release.r35.4.1",
                     {"nvidia-jetpack": "5.1.2-b104", "tensorrt": "8.5.2.2-1+cuda11.4"},
                     "11.4.315")
    # /etc/nvpmodel.conf is a link to the module's file, with an absolute target.
    write(root / "etc" / "nvpmodel" / CONF, (DATA / CONF).read_text())
    (root / "etc" / "nvpmodel.conf").symlink_to(f"/etc/nvpmodel/{CONF}")
    write(root / "var" / "lib" / "nvpmodel" / "status", "pmode:0000" if well_set else
          "pmode:0002")
    meminfo = "meminfo.orin-nx-8gb" if well_set else "meminfo.orin-nx-8gb.low"
    (root / "proc" / "meminfo").write_text((DATA / meminfo).read_text())
    cpu = root / "sys" / "devices" / "system" / "cpu"
    for n in range(6):
        online = well_set or n < 4
        write(cpu / f"cpu{n}" / "online", "1" if online else "0")
        if not online:
            continue
        freq = cpu / f"cpu{n}" / "cpufreq"
        top = 1984000 if well_set else 1420800
        write(freq / "scaling_max_freq", str(top))
        write(freq / "scaling_min_freq", str(top if well_set else 729600))
        write(freq / "cpuinfo_max_freq", "1984000")
        write(freq / "cpuinfo_min_freq", "115200")
        write(freq / "scaling_governor", "schedutil")
    gpu = root / "sys" / "class" / "devfreq" / "17000000.ga10b"
    write(gpu / "max_freq", "765000000" if well_set else "612000000")
    write(gpu / "min_freq", "765000000" if well_set else "306000000")
    write(root / "sys" / "class" / "devfreq" / "15340000.vic" / "min_freq", "115200000")
    write(root / "sys" / "class" / "devfreq" / "15340000.vic" / "max_freq", "729600000")
    if well_set:
        for n in range(6):
            write(root / "sys" / "block" / f"zram{n}" / "disksize", str(ZRAM_BYTES))
        write(root / "usr" / "bin" / "tegrastats", "#!/bin/sh")
    else:
        write(root / "sys" / "block" / "mmcblk0" / "size", "30535680")
    return root


def by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


def test_parsers_on_real_formats():
    modes, default = parse_nvpmodel_conf((DATA / CONF).read_text())
    assert modes == {0: "MAXN", 1: "10W", 2: "15W", 3: "20W"} and default == 2
    assert fastest_mode(modes) == 0
    assert parse_nvpmodel_query("NV Power Mode: MAXN\n0\n") == ("MAXN", 0)
    # Older L4T prints the fan mode first; a warning may come first too.
    assert parse_nvpmodel_query("NVPM WARN: fan mode is not set!\nNV Fan Mode:quiet\n"
                                "NV Power Mode: 15W\n2\n") == ("15W", 2)
    assert parse_nvpmodel_query("nvpmodel: command failed") == (None, None)
    assert parse_nvpmodel_status("pmode:0002 fmode:quiet") == 2
    assert parse_nvpmodel_status("pmode:0001\n") == 1
    assert parse_nvpmodel_status("") is None


def test_the_fastest_mode_is_found_by_name_not_by_id():
    """On an Orin Nano with the super configuration, mode 0 is 15W and MAXN_SUPER is 2: the
    fix must not say `nvpmodel -m 0` there."""
    conf = ("< POWER_MODEL ID=0 NAME=15W >\n< POWER_MODEL ID=1 NAME=25W >\n"
            "< POWER_MODEL ID=2 NAME=MAXN_SUPER >\n< POWER_MODEL ID=3 NAME=7W >\n"
            "< PM_CONFIG DEFAULT=1 >\n")
    modes, default = parse_nvpmodel_conf(conf)
    assert fastest_mode(modes) == 2 and default == 1
    assert fastest_mode({0: "MAXN", 4: "MAXN_SUPER"}) == 4
    assert fastest_mode({0: "MODE_15W", 1: "MODE_30W", 2: "MODE_10W"}) == 1
    assert fastest_mode({}) is None


def test_well_set_board(tmp_path):
    root = orin_nx_8gb(tmp_path, well_set=True)
    checks = by_name(run_checks(root))
    assert list(checks) == ["power mode", "clocks", "memory", "tegrastats", "cuda driver"]
    for name in ("power mode", "clocks", "memory", "tegrastats"):
        assert checks[name]["status"] == "ok", checks[name]
        assert checks[name]["fix"] is None
    assert checks["power mode"]["detail"].startswith("mode 0 (MAXN) (/var/lib/nvpmodel/status)")
    assert "boot default mode 2 (15W)" in checks["power mode"]["detail"]
    assert checks["clocks"]["detail"] == ("jetson_clocks applied: CPU (6 online) held at 1984 "
                                          "MHz; GPU 17000000.ga10b held at 765 MHz")
    assert checks["memory"]["detail"] == ("5.7 GiB available of 7.4 GiB; swap 3.7 GiB (3.7 "
                                          "free); zram 6 device(s), 3.7 GiB")
    assert checks["tegrastats"]["detail"] == "/usr/bin/tegrastats"
    # The driver of this machine is not the inspected board's: not asked under --root.
    assert checks["cuda driver"]["status"] == "skip"


def test_badly_set_board_says_each_fix(tmp_path):
    root = orin_nx_8gb(tmp_path, well_set=False)
    checks = by_name(run_checks(root))
    assert {n: c["status"] for n, c in checks.items()} == {
        "power mode": "warn", "clocks": "warn", "memory": "warn", "tegrastats": "warn",
        "cuda driver": "skip"}
    power = checks["power mode"]
    assert power["detail"].startswith("mode 2 (15W) (/var/lib/nvpmodel/status); fastest mode "
                                      "0 (MAXN)")
    assert power["fix"].startswith("sudo nvpmodel -m 0 (the id of MAXN in /etc/nvpmodel.conf")
    clock = checks["clocks"]
    assert clock["detail"] == ("clocks scale down when idle: CPU (4 online) 729-1420 MHz, the "
                               "power mode caps it below the 1984 MHz hardware maximum; GPU "
                               "17000000.ga10b 306-612 MHz")
    assert clock["fix"].startswith("sudo jetson_clocks holds the CPU, GPU and memory clocks")
    assert "not required" in clock["fix"]
    mem = checks["memory"]
    assert mem["detail"].startswith("less than 2 GiB available; no swap and no zram on a board "
                                    "of 8 GB or less: 1.4 GiB available of 7.4 GiB")
    assert "sudo systemctl set-default multi-user.target" in mem["fix"]
    assert "sudo systemctl enable --now nvzramconfig" in mem["fix"]
    assert "nvidia-l4t-tools" in checks["tegrastats"]["fix"]


def test_power_mode_sources(tmp_path):
    root = orin_nx_8gb(tmp_path, well_set=False)
    # Live: `nvpmodel -q` wins over the status file.
    live = power_mode(root, live=True, query=lambda: "NV Power Mode: MAXN\n0\n")
    assert live["status"] == "ok" and "(nvpmodel -q)" in live["detail"]
    # No binary answer, no status file: the board runs its boot default.
    (root / "var" / "lib" / "nvpmodel" / "status").unlink()
    assumed = power_mode(root, live=True, query=lambda: None)
    assert assumed["status"] == "warn"
    assert "mode 2 (15W) (assumed: the DEFAULT of /etc/nvpmodel.conf)" in assumed["detail"]
    # Under a test root the binary is never run.
    assert power_mode(root, live=False, query=lambda: pytest.fail("ran nvpmodel"))
    (root / "etc" / "nvpmodel.conf").unlink()
    missing = power_mode(root, live=False)
    assert missing["status"] == "warn" and "nvidia-l4t-nvpmodel" in missing["fix"]


def test_swap_without_zram_and_a_large_board(tmp_path):
    root = orin_nx_8gb(tmp_path, well_set=True)
    board = detect(root)
    assert board.memory_mb == 7763476 // 1024
    for n in range(6):
        (root / "sys" / "block" / f"zram{n}" / "disksize").write_text("0\n")
    swap_file = memory(root, board)
    assert swap_file["status"] == "ok" and swap_file["detail"].endswith("no zram")
    text = (DATA / "meminfo.orin-nx-8gb.low").read_text()
    (root / "proc" / "meminfo").write_text(text.replace("MemAvailable:    1498212",
                                                        "MemAvailable:    3498212"))
    no_swap = memory(root, board)
    assert no_swap["status"] == "warn" and "nvzramconfig" in no_swap["fix"]
    assert "set-default" not in no_swap["fix"]  # enough is available
    big = Board(True, "AGX Orin 64GB", "35.4.1", 62800)
    assert memory(root, big)["status"] == "ok"  # no swap is fine with 64 GB


def test_clocks_without_sysfs_and_tegrastats_on_path(tmp_path):
    assert clocks(tmp_path)["status"] == "warn"
    bin_dir = tmp_path / "bin"
    write(bin_dir / "tegrastats", "#!/bin/sh")
    (bin_dir / "tegrastats").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{old}"
    try:
        assert tegrastats(tmp_path, live=True)["detail"] == str(bin_dir / "tegrastats")
        assert tegrastats(tmp_path, live=False)["status"] == "warn"  # PATH not asked
    finally:
        os.environ["PATH"] = old


def test_cuda_driver_check():
    ok = cuda_driver(load=lambda: None,
                     properties=lambda: {"name": "Orin", "compute_capability": "8.7"},
                     memory_now=lambda: (3 * 2**30, int(7.4 * 2**30)))
    assert ok == {"name": "cuda driver", "status": "ok",
                  "detail": "Orin, compute capability 8.7, 3.0 GiB free of 7.4 GiB", "fix": None}

    def no_libcuda() -> None:
        raise BackendUnavailable("libcuda.so.1 not found (...): no NVIDIA driver on this "
                                 "machine")

    missing = cuda_driver(load=no_libcuda)
    assert missing["status"] == "fail" and "libcuda.so.1 not found" in missing["detail"]
    assert "nvidia-l4t-cuda" in missing["fix"]
    no_gpu = cuda_driver(load=lambda: None, properties=lambda: None)
    assert no_gpu["status"] == "fail" and "video group" in no_gpu["fix"]


def test_not_a_jetson_has_no_checks(tmp_path):
    assert run_checks(tmp_path) == []


def test_doctor_prints_the_checks_and_their_fixes(tmp_path, stgcnd_main):
    root = orin_nx_8gb(tmp_path, well_set=False)
    env = {"STGCND_ENGINE_DIR": str(tmp_path / "engines")}
    proc = stgcnd_main("doctor", "--root", str(root), env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "check       WARN  power mode: mode 2 (15W) (/var/lib/nvpmodel/status); fastest " \
           "mode 0 (MAXN), boot default mode 2 (15W)" in lines
    assert any(line.startswith("            fix: sudo nvpmodel -m 0 ") for line in lines)
    assert any(line.startswith("            fix: sudo jetson_clocks ") for line in lines)
    assert any("nvzramconfig" in line for line in lines)
    assert "check       skip  cuda driver: not asked: --root is not this machine's root" in lines
    report = json.loads(stgcnd_main("doctor", "--json", "--root", str(root), env=env,
                                    cwd=REPO).stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {"power mode": "warn", "clocks": "warn", "memory": "warn",
                        "tegrastats": "warn", "cuda driver": "skip"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in report["checks"])


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None,
                    reason="this Python has tensorrt")
def test_smoke_test_without_tensorrt_fails_with_the_fix(tmp_path, stgcnd_main):
    """`--smoke-test` where tensorrt does not import: reported, exit status 1."""
    root = orin_nx_8gb(tmp_path, well_set=True)
    env = {"STGCND_ENGINE_DIR": str(tmp_path / "engines")}
    proc = stgcnd_main("doctor", "--json", "--root", str(root), "--smoke-test", env=env,
                       cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    smoke = json.loads(proc.stdout)["checks"][-1]
    assert smoke["name"] == "tensorrt smoke test" and smoke["status"] == "fail"
    assert smoke["detail"].startswith("not run: tensorrt is not importable")
    assert "--system-site-packages" in smoke["fix"]
