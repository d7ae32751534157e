"""Daemon configuration: the TOML file, then `STGCND_*` environment variables, then flags.

One declared schema (msgspec structs) gives every key's type, range and doc; the example
config and the README's key list are generated from it. Unknown keys and variables are errors,
and every error names where the bad value came from. Each key says what a reload (SIGHUP) does
with it (APPLIES): a policy key is applied at once; an engine key is what models are built and
loaded from (a model whose engine keys changed is loaded anew, and a [server] engine key
loads every model anew); a restart key is logged as waiting for a restart (reload_key_ignored).
"""

# msgspec evaluates the structs' annotations at run time: on Python 3.8 they must be written
# Optional[...] and Tuple[...], not `X | None` and `tuple[...]`.
# ruff: noqa: UP006, UP045
from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Literal, NamedTuple, Optional, Tuple, cast
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from stgcnd.engines.options import DEFAULT_BUCKETS
from stgcnd.errors import UserError
from stgcnd.model.layouts import LAYOUTS
from stgcnd.model.spec import MOTION_FORMULAS, ModelSpec, default_labels

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.8 (JetPack 5) and 3.10 (JetPack 6)
    import tomli as tomllib
# Literal from typing itself (3.8 has it): typing_extensions >= 4.6 defines its own Literal on
# 3.8, which msgspec 0.18.6 (the last msgspec for 3.8) refuses ("Type ... is not supported").
if sys.version_info >= (3, 9):
    from typing import Annotated  # novermin (3.8 takes it below)
else:  # pragma: no cover - Python 3.8
    from typing_extensions import Annotated

DEFAULT_CONFIG_PATH = Path("/etc/stgcnd/stgcnd.toml")
BACKENDS = ("auto", "tensorrt", "torch", "onnxruntime", "noop")
# Keys of earlier releases, and what to do about them (a clear error, not "unknown key").
REMOVED_KEYS = {
    "dispatch": "the I/O loop drives every model now (a runtime that computes on the CPU "
                "gets a worker thread of its own): delete the line",
    "gc_freeze": "measured not to pay (frozen daemons had the worse tails): delete the line",
    "usable_visibility": "one threshold now gates the events and names a feed "
                         "low-visibility: set [server] visibility_threshold and delete the line",
}
# STGCND_* variables stgcnd reads that are not [server] keys; any other STGCND_* is a typo.
NON_CONFIG_ENV = ("STGCND_CONFIG", "STGCND_ENGINE_DIR")


APPLIES = ("policy", "engine", "restart")  # what a reload does with a key (the docstring above)


# The I/O loop's longest wait (server.py): the shortest period it can keep for what it sends
# on its own, such as heartbeats.
LOOP_TICK_MS = 100
# An open event's `update` messages: at most one a second each (a broker and a subscriber
# see every one; the score's smoothing changes nothing faster that matters to a site).
MIN_UPDATE_INTERVAL_S = 1.0


def _key(applies: str, doc: str, rule: str, path: bool, bounds: dict[str, float]) -> Meta:
    # cast: msgspec's overloads spell out each allowed mix of bounds; ours come as a dict.
    return Meta(description=doc, extra={"rule": rule, "applies": applies, "path": path},
                **cast("dict[str, Any]", bounds))


# Every key is declared with one of these three: its one-line doc, its range in words (for
# errors), whether it is a file or directory path, and its bounds.
def policy_key(doc: str, rule: str = "", path: bool = False, **bounds: float) -> Meta:
    """A key a reload applies at once."""
    return _key("policy", doc, rule, path, bounds)


def engine_key(doc: str, rule: str = "", path: bool = False, **bounds: float) -> Meta:
    """A key models are built and loaded from: a reload that changes it loads them anew."""
    return _key("engine", doc, rule, path, bounds)


def restart_key(doc: str, rule: str = "", path: bool = False, **bounds: float) -> Meta:
    """A [server] key only a restart applies: a reload that changes it says so."""
    return _key("restart", doc, rule, path, bounds)


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    endpoint: Annotated[str, restart_key(
        "ipc:///path/to/socket or tcp://HOST:PORT; empty: stgcnd.sock in the runtime "
        "directory (systemd's RuntimeDirectory, else $XDG_RUNTIME_DIR/stgcnd)")] = ""
    events_endpoint: Annotated[str, restart_key(
        "where action events are published (ZeroMQ PUB, topic = camera id; "
        "docs/protocol.md); empty: events only in the log")] = ""
    events_heartbeat_s: Annotated[float, restart_key(
        "seconds between heartbeats on events_endpoint: a subscriber that hears none for "
        "three knows the daemon is gone (docs/protocol.md); 0: none; else at least 0.1 (the "
        "loop's tick, which sends them)",
        "must be from 0 to 3600 seconds", ge=0, le=3600)] = 2.0
    engines_dir: Annotated[Optional[str], engine_key(
        "engine store: exported ONNX and one artefact per runtime/precision/device; unset: "
        "systemd's StateDirectory/engines, else ./engines when started in a checkout, else the "
        "user cache", path=True)] = None
    curve: Annotated[Literal["auto", "on", "off"], restart_key(
        "ZeroMQ CURVE: encryption and a key per client (docs/remote-cameras.md); auto: on "
        "where endpoint or events_endpoint is tcp on an address other than loopback")] = "auto"
    keys_dir: Annotated[Optional[str], restart_key(
        "CURVE: the daemon's key pair (server.key, server.key_secret), made on first start; "
        "unset: systemd's StateDirectory/keys, else ~/.local/state/stgcnd/keys",
        path=True)] = None
    authorized_keys_dir: Annotated[Optional[str], restart_key(
        "CURVE: one NAME.key per client allowed (`stgcnd keys create`), reread on SIGHUP; "
        "unset: keys_dir/authorized", path=True)] = None
    insecure: Annotated[bool, restart_key(
        "allow a tcp endpoint other machines can reach without CURVE (anyone who reaches the "
        "port may use every camera)")] = False
    stats_interval: Annotated[float, policy_key(
        "seconds between the latency and system log events", "must be > 0 seconds",
        gt=0)] = 10.0
    visibility_threshold: Annotated[float, restart_key(
        "skeleton quality: a joint below this visibility counts as lost (the feed's "
        "low-visibility), and events count a person whose joints' mean is below it as absent",
        "must be in 0..1", ge=0, le=1)] = 0.5
    quality_floor: Annotated[float, restart_key(
        "skeleton quality: a camera whose usable share of joints (frames with a person x "
        "joints not lost) stays below this for feed_intervals stats intervals logs one "
        "warning, and a recovery under the feed's hysteresis (docs/logging.md)",
        "must be in 0..1", ge=0, le=1)] = 0.5
    feed_enter: Annotated[float, policy_key(
        "feed health: a camera's feed goes silent, refused, blocked, no-person, "
        "low-visibility or out-of-frame when that share of what it sent is bad for "
        "feed_intervals stats intervals (docs/protocol.md)", "must be > 0 and at most 1",
        gt=0, le=1)] = 0.5
    feed_exit: Annotated[float, policy_key(
        "feed health: a bad feed's state holds while its share stays at or above this (at "
        "most feed_enter); below it for feed_intervals intervals, the feed is ok again",
        "must be > 0 and at most 1", gt=0, le=1)] = 0.2
    feed_intervals: Annotated[int, policy_key(
        "feed health: stats intervals in a row a feed's state must have stopped holding "
        "before it changes (event `feed` and log line feed_health)", "must be >= 1",
        ge=1)] = 2
    socket_mode: Annotated[int, restart_key(
        "permissions of the ipc socket file (0o660: camera processes in the daemon's group)",
        "must be a file mode from 0 to 0o777", ge=0, le=0o777)] = 0o660
    queue_size: Annotated[int, policy_key(
        "requests queued per camera before `busy` replies", "must be >= 1", ge=1)] = 8
    idle_timeout: Annotated[float, policy_key(
        "seconds after which an idle camera is forgotten (its push window and lane freed)",
        "must be > 0 seconds", gt=0)] = 300.0
    max_cameras: Annotated[int, restart_key(
        "cameras served at once; when all are taken, slots are shared by peer (client "
        "process, or address for remote tcp), an eighth kept for cameras served before "
        "(docs/hardening.md)", "must be >= 1", ge=1)] = 64
    max_connections: Annotated[int, restart_key(
        "connections accepted at most, cameras and event subscribers together (these get "
        "an eighth); 0: 3/4 of the free file descriptors, at most 4096",
        "must be >= 0 (0 = auto)", ge=0)] = 0
    max_rss_mb: Annotated[int, restart_key(
        "resident memory (MB) above which connections that send nothing are closed; 0: the "
        "size at READY + 512 MB", "must be >= 0 (0 = auto)", ge=0)] = 0
    memory_budget_mb: Annotated[int, engine_key(
        "device memory (MB) the models may take: weights, engines, activations, CUDA graphs; "
        "0: what is free at start less memory_reserve_mb (docs/jetson.md: the memory plan)",
        "must be >= 0 (0 = auto)", ge=0)] = 0
    memory_reserve_mb: Annotated[int, engine_key(
        "device memory (MB) left free for others (on a Jetson: the cameras and the OS, which "
        "share it); -1: 1536 on a Jetson, 0 elsewhere", "must be >= -1 (-1 = auto)",
        ge=-1)] = -1
    build_retry_after_s: Annotated[float, policy_key(
        "seconds after which a failed engine build is tried again at a start (sooner once "
        "25% more memory is free than when it failed; docs/engines.md)",
        "must be >= 0 seconds", ge=0)] = 3600.0
    build_attempts: Annotated[int, policy_key(
        "times a failing engine build is tried before it is left failed (until the "
        "configuration changes or `stgcnd build --rebuild`)", "must be >= 1", ge=1)] = 3
    drain_timeout: Annotated[float, policy_key(
        "on SIGTERM, seconds for in-flight work; keep below the unit's TimeoutStopSec (15)",
        "must be > 0 seconds", gt=0)] = 10.0
    stall_timeout: Annotated[float, policy_key(
        "a batch running this long stops the watchdog pings (systemd then restarts us)",
        "must be > 0 seconds", gt=0)] = 30.0
    max_message_bytes: Annotated[int, restart_key(
        "largest request in bytes (a 150-frame window of 5 persons is 0.3 MB)",
        "must be >= 1024", ge=1024)] = 4 * 1024 * 1024
    sndhwm: Annotated[int, restart_key(
        "unread replies queued per client before further ones are dropped", "must be >= 1",
        ge=1)] = 1000
    rcvhwm: Annotated[int, restart_key(
        "requests queued per connection before its sender is held back", "must be >= 1",
        ge=1)] = 1000
    warmup_runs: Annotated[int, engine_key(
        "warm-up runs of every batch shape before READY", "must be >= 0", ge=0)] = 3
    tegrastats: Annotated[Optional[str], restart_key(
        "path of tegrastats; unset: look on PATH (Jetson only)")] = None
    system_stats: Annotated[bool, restart_key(
        "sample CPU, memory, GPU, power and temperatures into `system` log events")] = True
    log_level: Annotated[Literal["debug", "info", "warning", "error"], policy_key(
        "log level of the daemon's JSON log")] = "info"


class ClassEvents(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[models.events.classes.NAME]: one class's thresholds."""

    enter: Optional[Annotated[float, Meta(ge=0, le=1)]] = None
    exit: Optional[Annotated[float, Meta(ge=0, le=1)]] = None


class CameraEvents(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[models.events.cameras.ID]: one camera's overrides (enabled = false: no events)."""

    enabled: bool = True
    enter: Optional[Annotated[float, Meta(ge=0, le=1)]] = None
    exit: Optional[Annotated[float, Meta(ge=0, le=1)]] = None
    min_duration_s: Optional[Annotated[float, Meta(ge=0)]] = None
    cooldown_s: Optional[Annotated[float, Meta(ge=0)]] = None
    tags: Dict[str, str] = {}  # over the model's tags, key by key (e.g. zone = "entrance")


class EventsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    enter: Annotated[float, policy_key(
        "a class's event starts when its smoothed probability stays at or above this",
        "must be in 0..1", ge=0, le=1)] = 0.8
    exit: Annotated[float, policy_key(
        "... and ends when it falls below this (<= enter: the hysteresis)",
        "must be in 0..1", ge=0, le=1)] = 0.5
    min_duration_s: Annotated[float, policy_key(
        "how long the smoothed probability must hold above enter before the start",
        "must be >= 0 seconds", ge=0)] = 2.0
    cooldown_s: Annotated[float, policy_key(
        "after an end, how long before the same camera's class may start again",
        "must be >= 0 seconds", ge=0)] = 30.0
    exit_hold_s: Annotated[float, policy_key(
        "how long the smoothed probability must stay below exit (or the windows without a "
        "person) before the end: a dropout shorter than this ends nothing; the cooldown "
        "counts from the end", "must be >= 0 seconds", ge=0)] = 1.5
    event_idle_s: Annotated[float, policy_key(
        "a camera with an open event and neither a request nor a prediction for this long "
        "has it ended (camera-silent), dated at its last prediction", "must be > 0 seconds",
        gt=0)] = 5.0
    min_usable: Annotated[float, policy_key(
        "a window starts and feeds events only when at least this share of its frames has "
        "a person (mean joint visibility >= [server] visibility_threshold, the feed's "
        "low-visibility threshold too) and its visible joints are in frame (fewer than "
        "feed_enter out of 0..1); 0: every window", "must be in 0..1", ge=0, le=1)] = 0.5
    smoothing: Annotated[Literal["ema", "k-of-n"], policy_key(
        "ema: exponential moving average of the probability; k-of-n: its k-th highest "
        "value over the last n predictions")] = "ema"
    ema_alpha: Annotated[float, policy_key(
        "ema: the newest prediction's weight", "must be in (0, 1]", gt=0, le=1)] = 0.5
    k: Annotated[int, policy_key("k-of-n: k", "must be >= 1", ge=1)] = 3
    n: Annotated[int, policy_key("k-of-n: n (>= k)", "must be >= 1", ge=1)] = 5
    quiet_classes: Annotated[Optional[Tuple[str, ...]], policy_key(
        "classes that never raise events, by the model's labels (the demo model's: normal, "
        "abnormal); unset: the first label (e.g. normal)")] = None
    classes: Annotated[Dict[str, ClassEvents], policy_key(
        "per class: [models.events.classes.NAME] enter / exit")] = {}
    cameras: Annotated[Dict[str, CameraEvents], policy_key(
        "per camera: [models.events.cameras.ID] enabled / enter / exit / min_duration_s / "
        "cooldown_s / tags (over the model's, key by key)")] = {}
    tags: Annotated[Dict[str, str], policy_key(
        "labels every event message of this model carries as `tags`, e.g. {site = "
        "\"store-12\"} (a camera's [models.events.cameras.ID] tags add to them, e.g. zone)")
        ] = {}
    update_interval_s: Annotated[float, policy_key(
        "while an event is open, an `update` message (score now, peak, duration) this often, "
        "at the camera's next prediction; 0: none; else at least 1",
        "must be 0 or from 1 to 86400 seconds", ge=0, le=86400)] = 0.0


class ModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, engine_key(
        "the model's name in requests, replies and logs (a request without one gets the first "
        "model); unset: the checkpoint's file name without extension, or demo",
        "must be a non-empty name", min_length=1)] = "demo"
    checkpoint: Annotated[Optional[str], engine_key(
        "the st-gcn checkpoint (.pt state_dict), or its exported .onnx",
        path=True)] = None
    demo: Annotated[bool, engine_key(
        "serve the demo model (random weights: its predictions mean nothing)")] = False
    layout: Annotated[str, engine_key(
        "skeleton layout: mediapipe (33 keypoints), openpose, coco, ntu-rgb+d",
        "must be one of " + ", ".join(sorted(LAYOUTS)))] = "mediapipe"
    persons: Annotated[int, engine_key("person slots M", "must be >= 1", ge=1)] = 1
    frames: Annotated[int, engine_key("window length T in frames (150: 6 s at 25 fps)",
                                      "must be >= 3", ge=3)] = 150
    motion: Annotated[str, engine_key(
        "the motion stream's formula the model was trained with (the original st-gcn "
        "two-stream uses second-difference)",
        "must be one of " + ", ".join(MOTION_FORMULAS))] = "first-difference"
    labels: Annotated[Tuple[str, ...], policy_key("class names, in class order")] = ()
    events: Annotated[Optional[EventsConfig], policy_key(
        "action events from this model's predictions: a [models.events] table (keys below); "
        "unset: none")] = None
    backend: Annotated[str, engine_key(
        "tensorrt, torch, onnxruntime, or auto (tensorrt, else torch on CUDA, else the "
        "fastest CPU runtime); noop: zero logits, to measure the daemon itself",
        "must be one of " + ", ".join(BACKENDS) + " (noop: zero logits, for measuring the "
        "daemon itself)")] = "auto"
    device: Annotated[Literal["auto", "cpu", "cuda"], engine_key(
        "for a named backend: cuda when it can use the GPU, else cpu")] = "auto"
    precision: Annotated[Literal["fp32", "fp16", "bf16", "int8"], engine_key(
        "fp32, fp16 (GPU), bf16 (torch on a CPU with AVX512-BF16/AMX) or int8 (needs "
        "calibration); with backend auto on a CPU, the lowest allowed: the fastest measured "
        "of the runtimes and precisions down to it is served")] = "fp32"
    stride: Annotated[int, policy_key(
        "push mode: one prediction every `stride` frames; one must take less than `stride` "
        "frames (40 ms each at 25 fps) or the camera waits (logged at start: "
        "camera_rate_at_risk); 25, one a second, keeps a CPU at the camera's rate",
        "must be >= 1", ge=1)] = 1
    max_batch: Annotated[int, engine_key(
        "largest batch across cameras; 0: 64 on a GPU, 8 on a Jetson, 16 on a CPU (the memory "
        "plan may keep fewer buckets)",
        "must be >= 0 (0 = auto)", ge=0)] = 0
    buckets: Annotated[Tuple[int, ...], engine_key(
        "batch shapes prepared before READY (a batch runs in the smallest that holds it); "
        "TensorRT builds one optimization profile for each",
        "must be batch sizes >= 1, e.g. [1, 2, 4, 8]",
        min_length=1)] = DEFAULT_BUCKETS
    min_interval_ms: Annotated[int, policy_key(
        "the least time between one camera's infer or push requests to this model: one "
        "that comes sooner after the last it let through is answered busy too-often, not "
        "queued nor run (0: off)",
        "must be in 0..3600000 ms (0: off)", ge=0, le=3_600_000)] = 0
    max_queue_delay_us: Annotated[int, policy_key(
        "how long a batch may wait to fill while the device is idle (0: never)",
        "must be in 0..1000000", ge=0, le=1_000_000)] = 0
    instances: Annotated[int, engine_key(
        "runners sharing the model's queue (each its own streams and graphs)",
        "must be >= 1", ge=1)] = 1
    client_streams: Annotated[bool, engine_key(
        "one CUDA stream per camera for its copies (false: one copy each way per batch)")] = True
    cuda_graph: Annotated[bool, engine_key(
        "on CUDA: one graph per bucket, captured before READY")] = True
    compile: Annotated[Literal["auto", "off", "reduce-overhead", "max-autotune"], engine_key(
        "torch on CUDA: torch.compile's kernels inside the graphs. auto: where Triton is "
        "installed, inductor's default kernels (seconds a bucket, cached in engines_dir) "
        "and, with upgrade = \"background\", every bucket autotuned in the background and "
        "swapped in (a start after that serves them at READY); max-autotune: the tuning "
        "before READY (minutes a bucket, once). Tuned kernels are tried against the "
        "reference in a process of their own and kept only where faster than the default "
        "ones")] = "auto"
    threads: Annotated[int, engine_key(
        "CPU runtimes' intra-op threads (0: all cores; leave some to the cameras on a Jetson)",
        "must be >= 0", ge=0)] = 0
    calibration: Annotated[Optional[str], engine_key(
        "int8: .npz/.npy of recorded windows (N, 3, T, V, M)", path=True)] = None
    allow_synthetic_calibration: Annotated[bool, engine_key(
        "int8: calibrate on generated skeletons when no calibration file is given")] = False
    upgrade: Annotated[Literal["background", "before-ready"], policy_key(
        "background: when its artefact (an int8 build and calibration, a TensorRT engine of "
        "backend auto, compile auto's tuned kernels) is not in the store, serve at once with "
        "what can (the fp32 session, the CPU, the default kernels), build it at idle "
        "priority and swap "
        "its runners in when validated, no request lost (logged: model_upgraded); "
        "a reload that changes an engine key builds the same way while the runners serving "
        "now serve on; before-ready: build first, READY after (a reload changing it applies "
        "at the next load of the model)")] = "background"
    noop_compute_us: Annotated[int, engine_key(
        "backend noop only: each batch finishes this long after it starts",
        "must be in 0..10000000 and is for backend = \"noop\" only", ge=0,
        le=10_000_000)] = 0

    @property
    def engine(self) -> tuple[object, ...]:
        """What the model's engine and runners are built from (ENGINE keys)."""
        return tuple(getattr(self, k) for k in ENGINE)


class MqttConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[events.mqtt]: every message of the events feed on an MQTT broker too (QoS 1, a
    retained state per camera; docs/protocol.md, "Events over MQTT")."""

    broker: Annotated[str, restart_key(
        "the broker: mqtt://HOST[:PORT] (1883), or mqtts://HOST[:PORT] (TLS, 8883)")] = ""
    client_id: Annotated[str, restart_key(
        "the MQTT client id, which names the broker's session of this daemon (one per "
        "daemon); empty: stgcnd-HOSTNAME")] = ""
    topic_prefix: Annotated[str, restart_key(
        "topics are PREFIX/CAMERA/event, PREFIX/CAMERA/state, PREFIX/CAMERA/class/CLASS "
        "(ON/OFF), PREFIX/CAMERA/feed and PREFIX/status (online/offline), all but the first "
        "retained",
        "must be a non-empty topic", min_length=1)] = "stgcnd"
    qos: Annotated[int, restart_key(
        "1: at least once (a resend after a reconnect may repeat a message: mqtt_id tells); "
        "2: once per hop; 0: at most once", "must be 0, 1 or 2", ge=0, le=2)] = 1
    username: Annotated[Optional[str], restart_key("the broker's user name")] = None
    password_file: Annotated[Optional[str], restart_key(
        "a file whose first line is the password (mode 0600: a config is often world-readable); "
        "one others may read or its group write is refused",
        path=True)] = None
    ca_file: Annotated[Optional[str], restart_key(
        "mqtts: the CA certificates that sign the broker's (PEM); unset: the system's",
        path=True)] = None
    cert_file: Annotated[Optional[str], restart_key(
        "mqtts: this daemon's client certificate (PEM), where the broker asks for one",
        path=True)] = None
    key_file: Annotated[Optional[str], restart_key(
        "mqtts: the client certificate's private key (PEM)", path=True)] = None
    buffer: Annotated[int, restart_key(
        "messages kept while the broker is away; when full the oldest goes (counted: stats' "
        "events_mqtt.dropped, one warning an outage)", "must be >= 1", ge=1)] = 10000
    forget_after_s: Annotated[float, restart_key(
        "at start and at a connection without a session, the retained topics of a camera "
        "neither served nor heard of for this long are removed (a camera gone; one still "
        "served is never gone, however calm); 0: never", "must be >= 0",
        ge=0)] = 86400.0
    discovery: Annotated[bool, restart_key(
        "Home Assistant MQTT discovery: a retained config per camera x class (binary sensor "
        "on PREFIX/CAMERA/class/CLASS) and per camera (sensor on PREFIX/CAMERA/feed), "
        "available while PREFIX/status is online")] = False
    discovery_prefix: Annotated[str, restart_key(
        "where Home Assistant reads discovery configs (its discovery_prefix)",
        "must be a non-empty topic", min_length=1)] = "homeassistant"

    @property
    def address(self) -> tuple[str, int, bool]:
        """(host, port, TLS) of `broker`; a UserError where it is not an mqtt(s) URL."""
        url = urlsplit(self.broker)
        try:
            port = url.port
        except ValueError:
            port = -1
        if url.scheme not in ("mqtt", "mqtts") or not url.hostname or port == -1 or \
                url.path not in ("", "/"):
            raise UserError(f"broker must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT], "
                            f"got {self.broker!r}")
        tls = url.scheme == "mqtts"
        return url.hostname, port or (8883 if tls else 1883), tls


class EventsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """[events]: where the events feed goes besides the log and events_endpoint."""

    mqtt: Annotated[Optional[MqttConfig], restart_key(
        "an MQTT broker: an [events.mqtt] table (keys below); unset: none")] = None


class Config(msgspec.Struct, frozen=True, kw_only=True):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    models: Tuple[ModelConfig, ...] = (ModelConfig(demo=True),)
    events: EventsSection = msgspec.field(default_factory=EventsSection)
    source: str = "built-in defaults (demo model)"

    @property
    def endpoint(self) -> str:
        return self.server.endpoint or f"ipc://{default_runtime_dir() / 'stgcnd.sock'}"

    @property
    def engines_dir(self) -> Path:
        return Path(self.server.engines_dir) if self.server.engines_dir else \
            default_engines_dir()

    def model(self, name: str | None) -> ModelConfig | None:
        if name is None:
            return self.models[0]
        return next((m for m in self.models if m.name == name), None)


class KeyDoc(NamedTuple):
    """What a key's declaration said of it: its one-line doc, its range in words, what a
    reload does with it (one of APPLIES), whether it is a path."""

    description: str
    rule: str
    applies: str
    path: bool


def _meta(annotation: Any) -> KeyDoc:
    meta = next(a for a in getattr(annotation, "__metadata__", ()) if isinstance(a, Meta))
    extra = meta.extra or {}
    return KeyDoc(meta.description or "", extra["rule"], extra["applies"], extra["path"])


def schema(cls: type[msgspec.Struct]) -> list[tuple[str, Any, KeyDoc]]:
    """(key, default, its KeyDoc) of every key of a config table, in declaration order."""
    return [(f.name, f.default, _meta(f.type)) for f in msgspec.structs.fields(cls)]


ENGINE = tuple(name for name, _, meta in schema(ModelConfig) if meta.applies == "engine")
MODEL_FILES = tuple(name for name, _, meta in schema(ModelConfig) if meta.path)
RESTART = tuple(name for name, _, meta in schema(ServerConfig) if meta.applies == "restart")
SERVER_ENGINE = tuple(name for name, _, meta in schema(ServerConfig)
                      if meta.applies == "engine")
PATHS = frozenset(n for c in (ServerConfig, ModelConfig, MqttConfig) for n, _, m in schema(c)
                  if m.path)
MQTT_FILES = tuple(name for name, _, meta in schema(MqttConfig) if meta.path)


def default_runtime_dir() -> Path:
    """systemd's RuntimeDirectory when set, else a private per-user directory."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/stgcnd-{os.getuid()}"
    return Path(base) / "stgcnd"


def default_engines_dir() -> Path:
    """systemd's StateDirectory, else ./engines in a development checkout, else the user cache."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / "engines"
    if Path("engines").is_dir() and Path("pyproject.toml").is_file():
        return Path("engines")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stgcnd" / "engines"


def engines_root(flag: Path | None = None) -> Path:
    """The engine store of a command: --engines, else $STGCND_ENGINE_DIR, else the daemon's
    default, so that commands and the daemon share one store."""
    if flag is not None:
        return flag
    env = os.environ.get("STGCND_ENGINE_DIR")
    return Path(env) if env else default_engines_dir()


# --- decoding, with errors that name where the bad value came from ---------------------------

_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false",
             "str": "a string", "array": "a list"}
_AT = re.compile(r" - at `\$\.?([A-Za-z_0-9]*)")


def _decode(cls: type[msgspec.Struct], raw: dict[str, Any], where: str,
            sources: dict[str, str], strict_keys: frozenset[str] = frozenset(),
            base: Path | None = None) -> Any:
    """msgspec's checks, its errors said the way users read them. Values from the
    environment or flags (`sources` says which) arrive as text: those are parsed. A relative
    path from the file (`strict_keys`) is made relative to its directory, `base`: the file
    means the same files and engine store wherever the daemon is started."""
    removed = sorted(set(raw) & set(REMOVED_KEYS))
    if removed:
        raise UserError(f"{where}: {removed[0]} was removed: "
                        f"{REMOVED_KEYS[removed[0]]}")
    known = [name for name, _, _ in schema(cls)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; {hint}known keys: "
                        f"{', '.join(known)}")
    values = dict(raw)
    for name in set(raw) - strict_keys:  # text from the environment or a flag
        values[name] = _parse(cls, name, raw[name], sources.get(name, f"{where} {name}"))
    for name in PATHS & strict_keys:  # a flag's or variable's path: as a shell means it
        if base is not None and isinstance(values[name], str) and values[name]:
            values[name] = str(base / Path(values[name]).expanduser())
    try:
        return msgspec.convert(values, cls)
    except msgspec.ValidationError as exc:
        raise _said(cls, str(exc), values, where, sources) from None


def _parse(cls: type[msgspec.Struct], name: str, value: Any, source: str) -> Any:
    field_type = next(f.type for f in msgspec.structs.fields(cls) if f.name == name)
    try:
        return msgspec.convert(value, field_type.__origin__ if hasattr(field_type, "__metadata__")
                               else field_type, strict=False)
    except msgspec.ValidationError as exc:
        raise _said(cls, f"{exc} - at `$.{name}`", {name: value}, source,
                    {name: source}) from None


def _said(cls: type[msgspec.Struct], message: str, values: dict[str, Any], where: str,
          sources: dict[str, str]) -> UserError:
    at = _AT.search(message)
    name = at.group(1) if at else ""
    source = sources.get(name, f"{where} {name}".strip())
    value = values.get(name)
    meta = next((m for n, _, m in schema(cls) if n == name), None)
    expected = re.match(r"Expected `(\w+)`, got", message)
    if expected:
        want = _EXPECTED.get(expected.group(1), f"a {expected.group(1)}")
        if expected.group(1) == "array":
            item = "integers" if "int" in str(next(f.type for f in msgspec.structs.fields(cls)
                                                   if f.name == name)) else "strings"
            want = f"a list of {item}"
        return UserError(f"{source}: invalid value {value!r} (expected {want})")
    if meta is not None and meta.rule:
        return UserError(f"{source}: {name} {meta.rule}, got {value!r}")
    unknown = re.match(r"Object contains unknown field `(\w+)`", message)
    if unknown and unknown.group(1) in REMOVED_KEYS:  # in a nested table ([models.events])
        return UserError(f"{source}: {unknown.group(1)} was removed: "
                         f"{REMOVED_KEYS[unknown.group(1)]}")
    return UserError(f"{source}: invalid value {value!r} ({message.split(' - ')[0]})")


def _check(config: Config) -> Config:
    """What one key alone cannot say: the models together, and keys that go together."""
    beat = config.server.events_heartbeat_s
    if 0 < beat < LOOP_TICK_MS / 1e3:  # heartbeats go from the loop, which wakes this often
        raise UserError(f"{config.source}: events_heartbeat_s {beat} is shorter than the "
                        f"daemon's loop tick ({LOOP_TICK_MS / 1e3} s), which sends them: set "
                        f"it to at least {LOOP_TICK_MS / 1e3}, or 0 for no heartbeats")
    names = [m.name for m in config.models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{config.source}: more than one model is named {twice[0]!r} (a model "
                        "without a name is named after its checkpoint's file, or demo); give "
                        "each [[models]] entry its own name = \"...\"")
    for m in config.models:
        where = f"{config.source}: model {m.name!r}"
        # A named model silently answering with random weights looks real ("shoplifting",
        # 0.99): the demo model must be asked for.
        if m.demo and m.checkpoint is not None:
            raise UserError(f"{where}: has both demo = true and a checkpoint; remove demo = "
                            "true to serve the checkpoint")
        if not m.demo and m.checkpoint is None:
            raise UserError(f"{where}: no checkpoint; add checkpoint = \"/path/to/model.pt\" "
                            "to serve your model, or demo = true to serve the demo model "
                            "(random weights: its predictions mean nothing)")
        rules = (("backend", m.backend in BACKENDS), ("layout", m.layout in LAYOUTS),
                 ("motion", m.motion in MOTION_FORMULAS),
                 ("buckets", all(b >= 1 for b in m.buckets)),
                 ("noop_compute_us", not m.noop_compute_us or m.backend == "noop"))
        for name, ok in rules:
            if not ok:
                meta = next(meta for n, _, meta in schema(ModelConfig) if n == name)
                raise UserError(f"{where}: {name} {meta.rule}, got "
                                f"{getattr(m, name)!r}")
        if m.events is not None:
            _check_events(m.events, known_labels(m), where)
    if config.events.mqtt is not None:
        _check_mqtt(config.events.mqtt, f"{config.source}: [events.mqtt]")
    return config


def _check_mqtt(mqtt: MqttConfig, where: str) -> None:
    try:
        _, _, tls = mqtt.address  # an empty broker too
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if "+" in mqtt.topic_prefix or "#" in mqtt.topic_prefix:
        raise UserError(f"{where}: topic_prefix must be a topic without + or #, got "
                        f"{mqtt.topic_prefix!r}")
    tls_files = [k for k in ("ca_file", "cert_file", "key_file") if getattr(mqtt, k)]
    if tls_files and not tls:
        raise UserError(f"{where}: {tls_files[0]} is for TLS; write the broker as mqtts://")
    if mqtt.password_file and not mqtt.username:
        raise UserError(f"{where}: password_file needs username")


def known_labels(m: ModelConfig) -> Tuple[str, ...] | None:
    """The class names the model will have, where its configuration alone says: its labels,
    else the demo model's (it has two classes); None for a checkpoint without labels, which
    may carry its own: check_event_classes runs once it is loaded (server/models.py)."""
    if m.labels:
        return tuple(m.labels)
    return default_labels(ModelSpec().num_class) if m.demo else None


def _check_events(ev: EventsConfig, labels: Tuple[str, ...] | None, where: str) -> None:
    if ev.exit > ev.enter:
        raise UserError(f"{where}: [models.events] exit ({ev.exit}) must be <= enter "
                        f"({ev.enter}): an event ends below exit, after it started at enter")
    if ev.smoothing == "k-of-n" and ev.k > ev.n:
        raise UserError(f"{where}: [models.events] k ({ev.k}) must be <= n ({ev.n})")
    if 0 < ev.update_interval_s < MIN_UPDATE_INTERVAL_S:  # each one is a message per event
        raise UserError(f"{where}: [models.events] update_interval_s {ev.update_interval_s} "
                        f"is shorter than {MIN_UPDATE_INTERVAL_S:g} s: set it to at least "
                        f"{MIN_UPDATE_INTERVAL_S:g}, or 0 for no updates")
    if labels is not None:
        check_event_classes(ev, labels, where)


def check_event_classes(ev: EventsConfig, labels: Tuple[str, ...], where: str) -> None:
    """Every class [models.events] names (classes, quiet_classes) is one of `labels`."""
    named = [*ev.classes, *(ev.quiet_classes or ())]
    unknown = [c for c in named if c not in labels]
    if unknown:
        raise UserError(f"{where}: [models.events] names class {unknown[0]!r}, not one of "
                        f"the model's labels {list(labels)}; set labels = [...] in the "
                        "model, in class order")


def check_files(config: Config) -> Config:
    """Every file a model names exists: all the missing ones said at once, before anything
    loads (a typo in the second model's path should not wait for the first one's build)."""
    missing = [f"model {m.name!r}: {name} not found: {getattr(m, name)}"
               for m in config.models for name in MODEL_FILES
               if getattr(m, name) and not Path(getattr(m, name)).expanduser().is_file()]
    mqtt = config.events.mqtt
    missing += [f"[events.mqtt] {name} not found: {getattr(mqtt, name)}"
                for name in MQTT_FILES if mqtt is not None and getattr(mqtt, name)
                and not Path(getattr(mqtt, name)).expanduser().is_file()]
    if missing:
        raise UserError(f"{config.source}: {'; '.join(missing)}. Fix the path (in the file, a "
                        "relative one is relative to the file's directory) or put the file there")
    if mqtt is not None and mqtt.password_file:
        _check_secret(Path(mqtt.password_file).expanduser(), config.source)
    return config


def _check_secret(path: Path, source: str) -> None:
    """A password file others may read (or a group may rewrite) gives the broker's password
    away (or the broker to someone else): refused, with the command that fixes it."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o024:
        raise UserError(f"{source}: [events.mqtt] password_file {path} has mode {mode:04o}: "
                        f"{'anyone may read it' if mode & 0o004 else 'its group may write it'}; "
                        f"run: chmod 600 {path} (owned by the daemon's user)")


def _env_overrides(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """[server] key -> (variable, value) from STGCND_<KEY>; an unknown STGCND_* is an error."""
    by_name = {f"STGCND_{name.upper()}": name for name, _, _ in schema(ServerConfig)}
    found = {}
    for name, value in env.items():
        if not name.startswith("STGCND_") or name in NON_CONFIG_ENV:
            continue
        if name not in by_name:
            close = difflib.get_close_matches(name, [*by_name, *NON_CONFIG_ENV], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"environment variable {name} is not one stgcnd knows; {hint}"
                            f"[server] keys: {', '.join(sorted(by_name))}; others: "
                            f"{', '.join(NON_CONFIG_ENV)}. Unset it or fix its name.")
        found[by_name[name]] = (name, value)
    return found


def load_config(path: Path | None = None, env: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None,
                flag_names: dict[str, str] | None = None) -> Config:
    """Read `path` (or the default path if it exists), apply env and flag overrides, check.

    `flag_names` maps an override's key to the flag it came from, for error messages
    (default: --key-with-dashes).
    """
    env = dict(os.environ if env is None else env)
    raw: dict[str, Any] = {}
    source = "built-in defaults (demo model)"
    if path is None and env.get("STGCND_CONFIG"):
        path = Path(env["STGCND_CONFIG"])
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: invalid TOML: {exc}") from None
        source = str(path)
    unknown = sorted(set(raw) - {"server", "models", "events"})
    if unknown:
        raise UserError(f"{source}: unknown section(s) {', '.join(unknown)}; use [server], "
                        "[[models]] and [events]")
    server_raw: Dict[str, Any] = dict(raw.get("server", {}))
    # Where each value came from, so that an error points at the right place to fix it.
    where = {name: f"{source} [server] {name}" for name, _, _ in schema(ServerConfig)}
    from_file = frozenset(server_raw)
    for name, (variable, value) in _env_overrides(env).items():
        server_raw[name] = value
        where[name] = f"environment variable {variable}"
    for name, value in (overrides or {}).items():
        if value is not None:
            server_raw[name] = value if isinstance(value, str) else str(value)
            flag = (flag_names or {}).get(name, "--" + name.replace("_", "-"))
            where[name] = f"flag {flag}"
    overridden = {n for n, w in where.items() if not w.startswith(source)}
    base = Path(os.path.abspath(path)).parent if path is not None else None
    server = _decode(ServerConfig, server_raw, f"{source} [server]", where,
                     strict_keys=from_file - overridden, base=base)
    models_raw = raw.get("models")
    if models_raw is None and path is not None:
        raise UserError(f"{source}: no [[models]] entry; add one with name and "
                        "checkpoint = \"/path/to/model.pt\" (or demo = true to try the demo "
                        "model)")
    if models_raw is None:
        models: tuple[ModelConfig, ...] = (ModelConfig(demo=True),)
    elif not isinstance(models_raw, list) or not models_raw:
        raise UserError(f"{source}: models must be an array of tables: [[models]]")
    else:
        models = tuple(_model(m, f"{source} [[models]] #{i + 1}", base)
                       for i, m in enumerate(models_raw))
    return _check(Config(server=server, models=models, events=_events(raw, source, base),
                         source=source))


def _events(raw: dict[str, Any], source: str, base: Path | None) -> EventsSection:
    """[events], its [events.mqtt] decoded as a table of its own (its paths anchored)."""
    section = dict(raw.get("events", {}))
    mqtt = section.pop("mqtt", None)
    _decode(EventsSection, section, f"{source} [events]", {}, frozenset(section))
    if mqtt is None:
        return EventsSection()
    where = f"{source} [events.mqtt]"
    return EventsSection(mqtt=_decode(MqttConfig, mqtt, where,
                                      {k: f"{where} {k}" for k in mqtt},
                                      strict_keys=frozenset(mqtt), base=base))


def _model(raw: dict[str, Any], where: str, base: Path | None) -> ModelConfig:
    model: ModelConfig = _decode(ModelConfig, raw, where, {k: f"{where} {k}" for k in raw},
                                 strict_keys=frozenset(raw), base=base)
    if "name" in raw or not model.checkpoint:
        return model
    # After its checkpoint (epoch60_model), as the engine store names it: not "demo", which
    # would pass a real model off as the random-weights one in logs and replies.
    return msgspec.structs.replace(model, name=Path(model.checkpoint).stem)
