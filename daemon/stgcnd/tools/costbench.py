"""How much CPU the system sampler itself costs: ``python -m stgcnd.tools.costbench``.

Runs a `SystemSampler` for a while with the main thread asleep and reports the process's CPU
time per wall second (user + system, all threads), i.e. the fraction of one core the sampler
uses. The `tegrastats` child is a separate process and is not included: on a Jetson it is the
same binary `tegrastats` users already run. Without tegrastats on PATH a stand-in that prints
recorded Orin lines is used, so the parsing path is exercised on any machine.
Target (issue 6): <= 1% of one core at a 1 s interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stgcnd.telemetry.sampler import SystemSampler

# Two real AGX Orin (JetPack 6) lines, replayed by the stand-in when tegrastats is absent.
_RECORDED = (
    "05-09-2026 18:42:06 RAM 18207/62841MB (lfb 466x4MB) SWAP 86/31420MB (cached 0MB) "
    "CPU [14%@2188,5%@2112,8%@2035,14%@2201,46%@1267,47%@1267,2%@1267,10%@1267,4%@1036,"
    "5%@1036,6%@1036,10%@1036] EMC_FREQ 3%@2133 GR3D_FREQ 0%@[0,0] NVENC 79%@166 NVDEC off "
    "NVJPG off NVJPG1 off VIC 36%@115 OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 "
    "cpu@52.562C soc2@48.437C soc0@49.093C tj@52.562C soc1@49.656C VDD_GPU_SOC 2412mW/2412mW "
    "VDD_CPU_CV 1607mW/1607mW VIN_SYS_5V0 4707mW/4707mW",
    "05-09-2026 18:42:07 RAM 18202/62841MB (lfb 466x4MB) SWAP 86/31420MB (cached 0MB) "
    "CPU [16%@1949,6%@1761,4%@1222,4%@2201,4%@1036,33%@1036,0%@1036,40%@1036,3%@1190,"
    "46%@1190,6%@1190,2%@1190] EMC_FREQ 3%@2133 GR3D_FREQ 0%@[0,0] NVENC 78%@166 NVDEC off "
    "NVJPG off NVJPG1 off VIC 32%@115 OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 "
    "cpu@52.343C soc2@48.343C soc0@49.062C tj@52.343C soc1@49.531C VDD_GPU_SOC 2412mW/2412mW "
    "VDD_CPU_CV 1607mW/1607mW VIN_SYS_5V0 4607mW/4657mW",
)

_STAND_IN = """#!{python}
import sys, time
lines = {lines!r}
ms = int(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 1000
i = 0
while True:
    time.sleep(ms / 1000)
    print(lines[i % len(lines)], flush=True)
    i += 1
"""


def write_stand_in(directory: Path) -> Path:
    path = directory / "tegrastats"
    path.write_text(_STAND_IN.format(python=sys.executable, lines=_RECORDED))
    path.chmod(0o755)
    return path


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def measure(seconds: float, interval_s: float, tegrastats: str | None) -> dict[str, Any]:

    samples: list[dict[str, Any]] = []
    sampler = SystemSampler(interval_s, samples.append, tegrastats_path=tegrastats)
    sampler.start()
    time.sleep(min(2 * interval_s, 2.0))  # let the child start and the first line arrive
    samples.clear()
    cpu0, wall0 = _cpu_s(), time.monotonic()
    time.sleep(seconds)
    cpu1, wall1 = _cpu_s(), time.monotonic()
    sampler.stop()
    wall = wall1 - wall0
    cpu = cpu1 - cpu0
    return {
        "interval_s": interval_s,
        "wall_s": round(wall, 3),
        "samples": len(samples),
        "source": sampler.source,
        "tegrastats": tegrastats,
        "cpu_s": round(cpu, 4),
        "cpu_ms_per_sample": round(1000 * cpu / max(1, len(samples)), 3),
        "pct_of_one_core": round(100 * cpu / wall, 3),
        "target_pct": 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stgcnd.tools.costbench",
        description="CPU cost of the stgcnd system sampler (target <= 1%% of one core at 1 s).")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window (30)")
    parser.add_argument("--interval", type=float, default=1.0, help="sample interval, s (1)")
    parser.add_argument("--tegrastats", metavar="PATH",
                        help="tegrastats executable (default: the one on PATH, else a stand-in "
                             "replaying recorded Orin lines)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.tegrastats or shutil.which("tegrastats") or str(write_stand_in(Path(tmp)))
        result = measure(args.seconds, args.interval, path)
    print(json.dumps(result))
    return 0 if result["pct_of_one_core"] <= result["target_pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
