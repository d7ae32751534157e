from __future__ import annotations

import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# A stand-in for the tegrastats binary: a real child process that prints recorded lines at the
# requested interval, records each start in a file, and optionally exits after N lines.
_STAND_IN = """#!{python}
import sys, time
with open({starts!r}, "a") as fh:
    fh.write("start\\n")
lines = [l for l in open({source!r}).read().splitlines() if l.strip()]
ms = int(sys.argv[sys.argv.index("--interval") + 1])
exit_after = {exit_after!r}
for i in range(10**9):
    if exit_after is not None and i >= exit_after:
        sys.exit(3)
    print(lines[i % len(lines)], flush=True)
    time.sleep(ms / 1000)
"""


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def make_tegrastats(tmp_path):
    def make(source: Path, exit_after: int | None = None, name: str = "tegrastats") -> Path:
        starts = tmp_path / f"{name}.starts"
        script = tmp_path / name
        script.write_text(_STAND_IN.format(python=sys.executable, starts=str(starts),
                                           source=str(source), exit_after=exit_after))
        script.chmod(0o755)
        return script

    return make


def starts_of(script: Path) -> int:
    path = script.with_name(script.name + ".starts")
    return len(path.read_text().splitlines()) if path.exists() else 0
