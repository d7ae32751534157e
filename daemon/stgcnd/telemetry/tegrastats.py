"""`tegrastats` on a Jetson: its child process kept running (TegrastatsReader), and its lines
from every generation (L4T 24 to JetPack 7) parsed into one dict shape; the formats are listed
above `parse_line`, which never raises: a line it cannot read gives ``{"ok": False, ...}``.
The sampler imports this module only where a `tegrastats` runs.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from stgcnd.log import get_logger
from stgcnd.threadname import name_os_thread

log = get_logger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_RUN_S = 60.0

# Sensors that read this value are power-gated or absent; it is not a temperature.
ABSENT_TEMPERATURE_C = -256.0

_UNIT_TO_MB = {"kB": 1 / 1024, "KB": 1 / 1024, "MB": 1.0, "GB": 1024.0}

_NUM = r"-?\d+(?:\.\d+)?"
_TIMESTAMP = re.compile(r"(\d{2})-(\d{2})-(\d{4}) (\d{2}):(\d{2}):(\d{2})")
_RAM = re.compile(r"RAM (\d+)/(\d+)([kKMG]B)(?:\s*\(lfb (\d+)x(\d+)([kKMG]B)\))?")
_SWAP = re.compile(r"SWAP (\d+)/(\d+)([kKMG]B)(?:\s*\(cached (\d+)([kKMG]B)\))?")
_IRAM = re.compile(r"IRAM (\d+/\d+kB\s*\(lfb \d+kB\))")
_CPU = re.compile(r"(?:CPU|cpu) \[([^\]]*)\](?:@(\d+))?")
_MTS = re.compile(r"MTS fg (\d+)% bg (\d+)%")
_EDP = re.compile(r"EDP limit (\d+)")
_TEMP = re.compile(rf"([A-Za-z][\w-]*)@({_NUM})C(?:/({_NUM})C)?(?=\s|$)")
_RAIL = re.compile(r"([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?:/(\d+)(?:mW)?)?(?=\s|$)")
# An engine: `NAME off`, `NAME 12%`, `NAME 12%@900`, `NAME 12%@[1,2]`, `NAME @900`, `NAME @[1,2]`,
# `NAME 150` (a bare frequency, e.g. APE or VIC_FREQ).
_ENGINE = re.compile(
    r"([A-Z][A-Z0-9_]*) (off|(?:(\d+)%)?(?:@(?:\[([^\]]*)\]|(\d+)))?)(?=\s|$)")

_GPU_NAMES = ("GR3D_FREQ", "GR3D")
_EMC_NAMES = ("EMC_FREQ", "EMC")


def _to_mb(value: str, unit: str) -> float:
    mb = int(value) * _UNIT_TO_MB[unit]
    return int(mb) if mb == int(mb) else round(mb, 3)


def _num(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() else value


def _freq_list(text: str) -> list[int | None]:
    """`0, 305,off` -> [0, 305, None]; anything not a number is an unknown (None) entry."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        out.append(int(part) if part.isdigit() else None)
    return out


def _parse_cpu(body: str, shared_freq: str | None) -> list[dict[str, Any] | None]:
    cores: list[dict[str, Any] | None] = []
    for entry in body.split(","):
        entry = entry.strip()
        if not entry or entry == "off":
            cores.append(None)
            continue
        load, _, freq = entry.partition("@")
        load = load.rstrip("%")
        freq = freq or (shared_freq or "")
        cores.append({
            "load_pct": int(load) if load.isdigit() else None,
            "freq_mhz": int(freq) if freq.isdigit() else None,
        })
    return cores


class _Line:
    """Accumulates what the scanner recognised in one line."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.recognised = 0

    def engine(self, name: str, state: str, load: str | None, freq_list: str | None,
               freq: str | None) -> None:
        self.recognised += 1
        if state == "off":
            entry: dict[str, Any] = {"off": True}
        else:
            entry = {}
            if load is not None:
                entry["load_pct"] = int(load)
            if freq_list is not None:
                freqs = _freq_list(freq_list)
                entry["freqs_mhz"] = freqs
                known = [f for f in freqs if f is not None]
                if known:
                    entry["freq_mhz"] = max(known)
            elif freq is not None:
                entry["freq_mhz"] = int(freq)
        if name in _GPU_NAMES:
            self._copy(entry, "gpu")
            if "freqs_mhz" in entry:
                self.out["gpu_gpc_freq_mhz"] = entry["freqs_mhz"]
        elif name in _EMC_NAMES:
            self._copy(entry, "emc")
        else:
            self.out.setdefault("engines", {})[name] = entry

    def _copy(self, entry: dict[str, Any], prefix: str) -> None:
        if "load_pct" in entry:
            self.out[f"{prefix}_load_pct"] = entry["load_pct"]
        if "freq_mhz" in entry:
            self.out[f"{prefix}_freq_mhz"] = entry["freq_mhz"]
        if entry.get("off"):
            self.out[f"{prefix}_off"] = True


def _on_timestamp(line: _Line, m: re.Match[str]) -> None:
    month, day, year, hh, mm, ss = (int(g) for g in m.groups())
    try:
        # tegrastats prints local wall-clock time without a zone; keep it naive.
        line.out["timestamp"] = datetime(year, month, day, hh, mm, ss).isoformat()
    except ValueError:
        line.out.setdefault("unrecognised", []).append(m.group(0))
        return
    line.recognised += 1


def _on_ram(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out["ram_used_mb"] = _to_mb(m.group(1), m.group(3))
    line.out["ram_total_mb"] = _to_mb(m.group(2), m.group(3))
    if m.group(4):
        line.out["ram_lfb"] = {"blocks": int(m.group(4)),
                               "block_mb": _to_mb(m.group(5), m.group(6))}


def _on_swap(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out["swap_used_mb"] = _to_mb(m.group(1), m.group(3))
    line.out["swap_total_mb"] = _to_mb(m.group(2), m.group(3))
    if m.group(4):
        line.out["swap_cached_mb"] = _to_mb(m.group(4), m.group(5))


def _on_iram(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out.setdefault("other", {})["IRAM"] = m.group(1)


def _on_cpu(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out["cpu"] = _parse_cpu(m.group(1), m.group(2))


def _on_mts(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out["mts_fg_pct"] = int(m.group(1))
    line.out["mts_bg_pct"] = int(m.group(2))


def _on_edp(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    line.out.setdefault("other", {})["EDP limit"] = m.group(1)


def _on_temp(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    name, current, peak = m.group(1), float(m.group(2)), m.group(3)
    temps = line.out.setdefault("temps_c", {})
    temps[name] = None if current <= ABSENT_TEMPERATURE_C else _num(m.group(2))
    if peak is not None:
        peaks = line.out.setdefault("temps_max_c", {})
        peaks[name] = None if float(peak) <= ABSENT_TEMPERATURE_C else _num(peak)


def _on_rail(line: _Line, m: re.Match[str]) -> None:
    line.recognised += 1
    name = m.group(1)
    line.out.setdefault("power_mw", {})[name] = int(m.group(2))
    line.out.setdefault("power_avg_mw", {})[name] = int(m.group(3))
    if m.group(4) is not None:
        line.out.setdefault("power_max_mw", {})[name] = int(m.group(4))


def _on_engine(line: _Line, m: re.Match[str]) -> None:
    name, state, load, freq_list, freq = m.groups()
    if state == "":
        # `NAME` followed by something that is not an engine value (the regex allows empty).
        raise _NoMatch
    if load is None and freq_list is None and freq is None and state != "off":
        raise _NoMatch
    line.engine(name, state, load, freq_list, freq)


def _on_bare_engine(line: _Line, m: re.Match[str]) -> None:
    # `APE 150`, `NVDEC 192`, `VIC_FREQ 729`: a frequency in MHz.
    line.engine(m.group(1), m.group(2), None, None, m.group(2))


class _NoMatch(Exception):
    pass


_BARE = re.compile(r"([A-Z][A-Z0-9_]*) (\d+)(?=\s|$)")

# Order matters: multi-token constructs first, then the generic engine forms.
_RULES: tuple[tuple[re.Pattern[str], Callable[[_Line, re.Match[str]], None]], ...] = (
    (_RAM, _on_ram),
    (_SWAP, _on_swap),
    (_IRAM, _on_iram),
    (_CPU, _on_cpu),
    (_MTS, _on_mts),
    (_EDP, _on_edp),
    (_TEMP, _on_temp),
    (_RAIL, _on_rail),
    (_ENGINE, _on_engine),
    (_BARE, _on_bare_engine),
)


# Formats handled (all seen on real devices, see tests/telemetry/data/README.md):
#
# - L4T 24-28 (TX1): ``cpu [2%,5%]@1734 EMC 0%@1600 GR3D 0%@998`` (one frequency for all cores).
# - JetPack 3/4 (TX2, Nano, Xavier): ``CPU [7%@345,off,...] EMC_FREQ 0%@1866 GR3D_FREQ 0%@140``,
#   unit-less rails ``VDD_IN 1931/1931`` (mW), ``PMIC@100C``.
# - JetPack 5 (Orin): a leading ``MM-DD-YYYY HH:MM:SS`` timestamp, ``mW`` rails,
#   ``GR3D_FREQ 0%@[0,0]`` (one frequency per GPC), sensors reading ``-256C`` while power-gated.
# - JetPack 6: lower-case sensor names (``cpu@52.5C``).
# - JetPack 7 (Orin, Thor): three-value rails ``cur/avg/max``, temperatures ``cur/max``, Thor's GPU
#   without utilisation (``GR3D_FREQ @[314,314,314]``), engines ``off`` or ``@freq``.
# - Without root, tegrastats leaves out frequencies (``EMC_FREQ 0%``), SWAP or rails: those keys are
#   simply absent from the result.
def parse_line(text: str) -> dict[str, Any]:
    """One tegrastats line -> dict (keys present only where the line has them).

    Keys: ``ok``, ``timestamp`` (ISO, local time as printed), ``ram_used_mb``, ``ram_total_mb``,
    ``swap_used_mb``, ``swap_total_mb``, ``swap_cached_mb``, ``cpu`` (per core
    ``{"load_pct", "freq_mhz"}``, ``None`` for an ``off`` core), ``gpu_load_pct``,
    ``gpu_freq_mhz`` (highest GPC), ``gpu_gpc_freq_mhz``, ``emc_load_pct``, ``emc_freq_mhz``,
    ``temps_c`` (``None`` for a sensor reading -256), ``temps_max_c`` (JetPack 7 second value),
    ``power_mw`` (current, mW), ``power_avg_mw``, ``power_max_mw`` (JetPack 7), ``engines``,
    ``mts_fg_pct``/``mts_bg_pct``, ``other`` and ``unrecognised`` (raw tokens).
    """
    line_text = text.strip()
    if not line_text:
        return {"ok": False, "error": "empty line", "raw": text}
    try:
        return _scan(line_text)
    except Exception as exc:  # a parser bug must never take down the sampler
        return {"ok": False, "error": f"parser failure: {exc!r}", "raw": line_text}


def _scan(text: str) -> dict[str, Any]:
    line = _Line()
    pos = 0
    m = _TIMESTAMP.match(text)
    if m:
        _on_timestamp(line, m)
        pos = m.end()
    n = len(text)
    while pos < n:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        for pattern, handler in _RULES:
            m = pattern.match(text, pos)
            if not m:
                continue
            try:
                handler(line, m)
            except _NoMatch:
                continue
            pos = m.end()
            break
        else:
            end = pos
            while end < n and not text[end].isspace():
                end += 1
            line.out.setdefault("unrecognised", []).append(text[pos:end])
            pos = end
    if line.recognised == 0:
        return {"ok": False, "error": "no tegrastats field recognised", "raw": text}
    return {"ok": True, **line.out}


class TegrastatsReader:
    """Keeps a `tegrastats` child running and remembers its latest parsed line."""

    def __init__(self, path: str, interval_ms: int, backoff_start_s: float = BACKOFF_START_S,
                 backoff_max_s: float = BACKOFF_MAX_S) -> None:
        self.path = path
        self.interval_ms = interval_ms
        self.backoff_start_s = backoff_start_s
        self.backoff_max_s = backoff_max_s
        self.restarts = 0
        self.unparsed_lines = 0
        self._latest: dict[str, Any] | None = None
        self._latest_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stgcnd-tegrastats", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._terminate()
        if self._thread is not None:
            self._thread.join(timeout)

    def latest(self) -> tuple[dict[str, Any] | None, float | None]:
        """(latest parsed line, its age in seconds)."""
        with self._lock:
            if self._latest is None or self._latest_at is None:
                return None, None
            return self._latest, time.monotonic() - self._latest_at

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)

    def _run(self) -> None:
        name_os_thread("stgcnd-tegra")
        backoff = self.backoff_start_s
        first = True
        while not self._stop.is_set():
            if not first:
                self.restarts += 1
            first = False
            started = time.monotonic()
            rc = self._run_once()
            if self._stop.is_set():
                break
            ran_s = time.monotonic() - started
            if ran_s >= HEALTHY_RUN_S:
                backoff = self.backoff_start_s
            log.warning("tegrastats_exited", returncode=rc, ran_s=round(ran_s, 3),
                        restart_in_s=backoff, restarts=self.restarts)
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2, self.backoff_max_s)

    def _run_once(self) -> int | None:
        try:
            proc = subprocess.Popen(
                [self.path, "--interval", str(self.interval_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                text=True, bufsize=1)
        except OSError as exc:
            log.warning("tegrastats_start_failed", path=self.path, error=str(exc))
            return None
        self._proc = proc
        assert proc.stdout is not None
        if self._stop.is_set():  # stop() ran while we were starting it
            self._terminate()
        try:
            for line in proc.stdout:
                parsed = parse_line(line)
                if not parsed.get("ok"):
                    self.unparsed_lines += 1
                    continue
                with self._lock:
                    self._latest = parsed
                    self._latest_at = time.monotonic()
                if self._stop.is_set():
                    break
        finally:
            proc.stdout.close()
            self._terminate()
        return proc.wait()
