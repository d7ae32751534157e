"""trtexec console logs (TensorRT 7-11): options, device, performance summary, build facts
(docs/trtexec.md, "What each parser reads"); a line's `[MM/DD/YYYY-HH:MM:SS] [I] ` is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError

# The timestamp is optional: logs pasted without it ("[I] Throughput: ...") parse the same.
_PREFIX = re.compile(r"^(?:\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\]\s+)?\[(?P<sev>[A-Z])\]\s?")
_BANNER = re.compile(r"^&&&& (?P<status>RUNNING|PASSED|FAILED|WAIVED) TensorRT\.trtexec"
                     r"(?: \[TensorRT v(?P<ver>\d+)\])?(?: # (?P<cmd>.*))?$")
_SECTION = re.compile(r"^=== (?P<name>.+?) ===$")
_KEY_VALUE = re.compile(r"^(?P<key>[^:]+?):\s?(?P<value>.*)$")
_STAT = re.compile(r"(?P<name>min|max|mean|median|percentile\((?P<pct>[\d.]+)%\))\s*=\s*"
                   r"(?P<value>[-+\d.eE]+|nan|inf)\s*(?P<unit>ms|s|us)?")
_MEM_CHANGE = re.compile(r"\[MemUsageChange\]\s*(?P<stage>.+?):\s*CPU\s*(?P<cpu>[-+]\d+),\s*"
                         r"GPU\s*(?P<gpu>[-+]\d+)(?:,\s*now:\s*CPU\s*(?P<cpu_now>\d+),\s*"
                         r"GPU\s*(?P<gpu_now>\d+))?\s*\((?P<unit>\w+)\)")
_TOTAL_MEMORY = re.compile(r"^Total (?P<what>[\w ]+?) Memory:\s*(?P<value>\d+)\s*"
                           r"(?P<unit>bytes|MiB)?")
_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_BUILD_FACTS = {
    "engine_built_s": re.compile(rf"Engine built in {_NUM} sec"),
    "engine_deserialized_s": re.compile(rf"Engine deserialized in {_NUM} sec"),
    "engine_generation_s": re.compile(rf"Engine generation completed in {_NUM} seconds"),
    "created_engine_size_mib": re.compile(rf"Created engine with size: {_NUM} MiB"),
    "loaded_engine_size_mib": re.compile(rf"Loaded engine size: {_NUM} MiB"),
}
_TRACE_FACTS = {
    "warmup": re.compile(rf"Warmup completed {_NUM} queries over {_NUM} ms"),
    "trace": re.compile(rf"Timing trace has {_NUM} queries over {_NUM} s"),
}
_OPTION_SECTIONS = {
    "Model Options": "model_options",
    "Build Options": "build_options",
    "System Options": "system_options",
    "Inference Options": "inference_options",
    "Reporting Options": "reporting_options",
    "Device Information": "device_information",
}


def decode_banner_version(code: str) -> str:
    """`8205` -> 8.2.5, `8601` -> 8.6.1, `100300` -> 10.3.0 (trtexec banner version codes)."""
    n = int(code)
    if n >= 100000:  # TensorRT 10+: major*10000 + minor*100 + patch
        return f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    return f"{n // 1000}.{n // 100 % 10}.{n % 100}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _stat_key(match: re.Match[str]) -> str:
    pct = match.group("pct")
    if pct is None:
        return match.group("name")
    return "p" + (pct[:-2] if pct.endswith(".0") else pct).replace(".", "_")


@dataclass
class TrtexecLog:
    status: str | None = None
    command: str | None = None
    tensorrt_version: str | None = None
    sections: dict[str, dict[str, str]] = field(default_factory=dict)
    performance: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    memory_changes: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    def build_metadata(self) -> dict[str, Any]:
        return {
            "tensorrt_version": self.tensorrt_version,
            "command": self.command,
            "model_options": self.sections.get("model_options", {}),
            "build_options": self.sections.get("build_options", {}),
            "system_options": self.sections.get("system_options", {}),
            "device_information": self.sections.get("device_information", {}),
            "build": self.build,
            "memory_usage_changes": self.memory_changes,
        }

    def profile_metadata(self) -> dict[str, Any]:
        return {
            "tensorrt_version": self.tensorrt_version,
            "status": self.status,
            "performance_summary": self.performance,
            "inference_options": self.sections.get("inference_options", {}),
            "reporting_options": self.sections.get("reporting_options", {}),
            "device_information": self.sections.get("device_information", {}),
            "hints": self.hints,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "command": self.command,
                "tensorrt_version": self.tensorrt_version,
                "build_metadata": self.build_metadata(),
                "profile_metadata": self.profile_metadata(),
                "warnings": self.warnings, "errors": self.errors}


def _parse_performance_line(message: str, perf: dict[str, Any]) -> bool:
    key_value = _KEY_VALUE.match(message)
    if not key_value:
        return False
    key, value = key_value.group("key").strip(), key_value.group("value").strip()
    stats = list(_STAT.finditer(value))
    if stats:
        perf.setdefault("metrics_ms", {})[_slug(key)] = {
            _stat_key(m): float(m.group("value")) * (1000.0 if m.group("unit") == "s" else 1.0)
            for m in stats}
        return True
    number = re.match(rf"^{_NUM}\s*(qps|s|ms)?", value)
    if not number:
        return False
    amount, unit = float(number.group(1)), number.group(2)
    if key == "Throughput":
        perf["throughput_qps"] = amount
    else:
        perf[_slug(key) + (f"_{unit}" if unit in ("s", "ms") else "")] = amount
    return True


def parse_log(text: str) -> TrtexecLog:
    parsed = TrtexecLog()
    section: str | None = None
    last_option_key: str | None = None
    for raw_line in text.splitlines():
        line = raw_line.rstrip("\r")
        prefix = _PREFIX.match(line)
        severity = prefix.group("sev") if prefix else None
        message = line[prefix.end():] if prefix else line
        banner = _BANNER.match(line.strip())
        if banner:
            parsed.status = banner.group("status")
            parsed.command = banner.group("cmd") or parsed.command
            if banner.group("ver") and not parsed.tensorrt_version:
                parsed.tensorrt_version = decode_banner_version(banner.group("ver"))
            section = None
            continue
        if severity in ("W", "E"):
            (parsed.warnings if severity == "W" else parsed.errors).append(message.strip())
            if section == "performance" and severity == "W":
                parsed.hints.append(message.strip())
            continue
        heading = _SECTION.match(message.strip())
        if heading:
            name = heading.group("name")
            section = "performance" if name.lower() == "performance summary" else \
                _OPTION_SECTIONS.get(name, f"other:{name}")
            last_option_key = None
            continue
        stripped = message.strip()
        version = re.match(r"^TensorRT version:\s*(\S+)", stripped)
        if version:
            parsed.tensorrt_version = version.group(1)
            section = None
            continue
        if section == "performance":
            if not stripped or stripped.startswith("Explanations"):
                section = None
            else:
                _parse_performance_line(stripped, parsed.performance)
            continue
        if section is not None and section in _OPTION_SECTIONS.values():
            if not stripped or stripped.startswith("[TRT]"):
                section = None
            else:
                key_value = _KEY_VALUE.match(stripped)
                if key_value:
                    last_option_key = key_value.group("key").strip()
                    parsed.sections.setdefault(section, {})[last_option_key] = \
                        key_value.group("value").strip()
                elif last_option_key:  # a continuation line, e.g. a second plugin
                    options = parsed.sections[section]
                    options[last_option_key] = f"{options[last_option_key]} {stripped}".strip()
                continue
        _parse_build_facts(stripped, parsed)
    return parsed


def _parse_build_facts(message: str, parsed: TrtexecLog) -> None:
    mem = _MEM_CHANGE.search(message)
    if mem:
        change: dict[str, Any] = {"stage": mem.group("stage").strip(),
                                  "cpu_delta": int(mem.group("cpu")),
                                  "gpu_delta": int(mem.group("gpu")), "unit": mem.group("unit")}
        if mem.group("cpu_now") is not None:
            change["cpu_now"] = int(mem.group("cpu_now"))
            change["gpu_now"] = int(mem.group("gpu_now"))
        parsed.memory_changes.append(change)
        return
    body = re.sub(r"^\[TRT\]\s*", "", message)
    total = _TOTAL_MEMORY.match(body)
    if total:
        unit = "mib" if total.group("unit") == "MiB" else "bytes"
        key = f"total_{_slug(total.group('what'))}_memory_{unit}"
        parsed.build[key] = int(total.group("value"))
        return
    for key, pattern in _BUILD_FACTS.items():
        found = pattern.search(body)
        if found:
            parsed.build[key] = float(found.group(1))
            return
    for key, pattern in _TRACE_FACTS.items():
        found = pattern.search(body)
        if found:
            parsed.build[f"{key}_queries"] = int(float(found.group(1)))
            unit = "ms" if key == "warmup" else "s"
            parsed.build[f"{key}_duration_{unit}"] = float(found.group(2))
            return


def load_log(path: str | Path) -> TrtexecLog:
    path = Path(path)
    try:
        return parse_log(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise UserError(f"cannot read trtexec log {path}: {exc}") from None


# TREx (trt-engine-explorer) stores the log's summary as positional lists; their order is the
# order of the fields on the log line.
_TREX_POSITIONS = {
    5: ("min", "max", "mean", "median", "p99"),
    7: ("min", "max", "mean", "median", "p90", "p95", "p99"),
}


def from_trex_metadata(data: dict[str, Any]) -> TrtexecLog:
    """Read TREx's `*.profile.metadata.json` / `*.build.metadata.json` (parsed trtexec logs)."""
    parsed = TrtexecLog()
    for key in ("model_options", "build_options", "inference_options", "device_information"):
        if isinstance(data.get(key), dict):
            parsed.sections[key] = {k: str(v) for k, v in data[key].items()}
    summary = data.get("performance_summary")
    if isinstance(summary, dict):
        for key, value in summary.items():
            if isinstance(value, dict):  # already named (stgcnd's own profile.metadata.json)
                parsed.performance[key] = value
            elif isinstance(value, list):
                names = _TREX_POSITIONS.get(len(value))
                if names:
                    parsed.performance.setdefault("metrics_ms", {})[_slug(key)] = {
                        n: float(v) for n, v in zip(names, value)}
            elif key == "Throughput":
                parsed.performance["throughput_qps"] = float(value)
            elif isinstance(value, (int, float)):
                # TREx keys are log labels ("Total Host Walltime", seconds); stgcnd's are slugs.
                slug = key if key == _slug(key) else f"{_slug(key)}_s"
                parsed.performance[slug] = float(value)
    if isinstance(data.get("tensorrt_version"), str):
        parsed.tensorrt_version = data["tensorrt_version"]
    return parsed


def load_logish(paths: list[Path], log: bool) -> TrtexecLog:
    """A trtexec log (`log`), or TREx's build and profile metadata files merged."""
    if log:
        return load_log(paths[0])
    merged: dict[str, Any] = {}
    for path in paths:
        merged.update(json.loads(path.read_text(encoding="utf-8")))
    return from_trex_metadata(merged)


def write_metadata(parsed: TrtexecLog, out: Path) -> list[Path]:
    """build.metadata.json and profile.metadata.json (TREx's names) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("build.metadata.json", parsed.build_metadata()),
                       ("profile.metadata.json", parsed.profile_metadata())):
        (out / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return [out / "build.metadata.json", out / "profile.metadata.json"]
