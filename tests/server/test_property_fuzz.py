"""The property fuzzer (issue #41): hypothesis scenarios over every header field the daemon
reads, at its extremes (tests/fuzz_headers.py), against one real `stgcnd serve` whose model
has events, with the events PUB socket on and [events.mqtt] on a real Mosquitto.

Each example is a few fresh cameras and up to 10 steps: requests of every op with a `ts` that
moves per camera (forward, back, the same, jumps to 1e306 or 1.7e308, non-finite, wrong types),
header keys replaced by extremes (floats at +-1.7e308, subnormals, -0.0; ints 0 to 2^64-1 and
negative; strings at and past their limits, non-UTF-8; nested maps, wrong types), cases of the
seeded generators of tests/fuzz_messages.py, and pauses in which the events' silent-camera
sweep runs. Properties, per request: exactly one reply, with the request's id (none lost, none
duplicated), never `internal`, `malformed` for a `ts` that is no number within +-1e11
(docs/protocol.md); per example: the daemon process alive (a death is recorded, the daemon
restarted, the example failed). After the run: a new camera is served and its events reach
the PUB socket and the broker; every events message, MQTT message and log line is well
formed (no NaN or infinity anywhere).

    python -m pytest -q tests/server/test_property_fuzz.py           # CI: derandomized, 1,000
    TEST_PROPERTY_FUZZ_EXAMPLES=10000 python -m pytest -q tests/server/test_property_fuzz.py
    TEST_FUZZ_SEED=7 python -m pytest -q tests/server/test_property_fuzz.py   # another seed
    TEST_PROPERTY_FUZZ_SHRINK=1 ...   # shrink a failure to a minimal scenario (slow)
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import paho.mqtt.client as mqtt
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from paho.mqtt.enums import CallbackAPIVersion

from stgcnd.server.mqtt_topics import FEED_STATES
from stgcnd_client import Client
from stgcnd_client.protocol import Limits
from tests.fuzz_headers import Pause, Player, Scenario, scenarios
from tests.mosquitto import Broker, needs_mosquitto
from tests.server.daemon_harness import Daemon
from tests.server.test_fuzz import FuzzReport, FuzzRunner, log_lines

pytestmark = [pytest.mark.slow, needs_mosquitto]

FRAMES = 4           # a camera's pushes make a prediction within an example
WINDOW = (3, FRAMES, 33, 1)
MAX_MESSAGE_BYTES = 256 * 1024
LIMITS = Limits(max_message_bytes=MAX_MESSAGE_BYTES)
EXAMPLES = int(os.environ.get("TEST_PROPERTY_FUZZ_EXAMPLES", "1000"))
SEED = os.environ.get("TEST_FUZZ_SEED")
SHRINK = bool(os.environ.get("TEST_PROPERTY_FUZZ_SHRINK"))
EVENT_IDLE_S = 0.2   # the silent-camera sweep ends a camera's events this soon: every example's

# The noop backend's zero logits give P = 0.5 on every window: at enter 0.5 a camera's
# predictions start an event, which the sweep ends once the camera falls silent, so every
# example's cameras go through a start and an end on their own clock (`ts`). demo2: no events.
MODELS = f"""[[models]]
name = "demo"
backend = "noop"
demo = true
frames = {FRAMES}
labels = ["normal", "shoplifting"]
[models.events]
enter = 0.5
exit = 0.4
min_duration_s = 0.0
cooldown_s = 0.0
min_usable = 0.0
event_idle_s = {EVENT_IDLE_S}
[[models]]
name = "demo2"
backend = "noop"
demo = true
frames = {FRAMES}

[events.mqtt]
broker = "{{broker}}"
client_id = "stgcnd-property-fuzz"
"""


class Collector:
    """Everything the daemon publishes, from a SUB socket (every topic) and an MQTT
    subscriber (stgcnd/#), each on its own thread: raw, to be judged afterwards."""

    def __init__(self, events_endpoint: str, broker: Broker) -> None:
        self.pub: list[list[bytes]] = []
        self.mqtt: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        ctx = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(events_endpoint)
        self._thread = threading.Thread(target=self._read_pub, daemon=True)
        self._thread.start()
        subscribed = threading.Event()
        self._mqtt = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="property-fuzz",
                                 protocol=mqtt.MQTTv311)
        self._mqtt.on_connect = lambda c, *_: c.subscribe("stgcnd/#", qos=1)
        self._mqtt.on_subscribe = lambda *_: subscribed.set()
        self._mqtt.on_message = self._on_mqtt
        self._mqtt.connect("127.0.0.1", broker.port)
        self._mqtt.loop_start()
        assert subscribed.wait(10), "no SUBACK from the test's broker"

    def _read_pub(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                frames = self._sub.recv_multipart()
                with self.lock:
                    self.pub.append(frames)

    def _on_mqtt(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.mqtt.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def published(self) -> tuple[list[list[bytes]], list[tuple[str, bytes, bool]]]:
        with self.lock:
            return list(self.pub), list(self.mqtt)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sub.close(0)
        self._mqtt.disconnect()
        self._mqtt.loop_stop()


@dataclass
class FuzzRun:
    """One daemon under the fuzzer; it is restarted after a death, which is recorded."""
    daemon: Daemon
    report: FuzzReport
    player: Player = field(default_factory=lambda: Player(WINDOW, LIMITS))
    deaths: list[str] = field(default_factory=list)
    failure: str | None = None       # hypothesis' report of a failing example
    paused_s: float = 0.0
    _log_at: int = 0                 # the log's size when the daemon last started

    def start(self) -> None:
        self._log_at = self.daemon.log_path.stat().st_size if self.daemon.log_path.exists() \
            else 0
        self.daemon.start()

    def death(self) -> str | None:
        """If the daemon died: what it logged of it (recorded), after which it restarts."""
        proc = self.daemon.proc
        if proc is None or proc.poll() is None:
            return None
        text = self.daemon.log_path.read_bytes()[self._log_at:].decode(errors="replace")
        what = f"exit code {proc.returncode}"
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "exception" in event:  # the last frames say where
                where = [t for t in str(event["exception"]).splitlines()
                         if t.strip(" ^~")][-4:]
                what += f", {event.get('event')}: " + " | ".join(s.strip() for s in where)
        self.deaths.append(what)
        self.start()
        return what

    def play(self, runner: FuzzRunner, scenario: Scenario) -> None:
        rep = self.report
        self.death()  # a death after the last example's replies (e.g. in the sweep)
        before = Counter(rep.violation_counts)
        examples_before = {p: list(v) for p, v in rep.violations.items()}
        sent = []
        rep.stalled = False
        for item in self.player.cases(scenario):
            if isinstance(item, Pause):
                time.sleep(item.seconds)
                self.paused_s += item.seconds
                item = self.player.ping()
            runner.run(item)
            sent.append(item.describe(160))
            if rep.stalled:
                break
        died = self.death()
        broken = {p: n - before[p] for p, n in rep.violation_counts.items() if n > before[p]}
        if not broken and died is None:
            return
        lines = [f"example {self.player.examples}, after {len(sent)} request(s):"]
        if died is not None:
            lines.append(f"  the daemon died: {died}")
        for prop, n in broken.items():
            new = rep.violations[prop][len(examples_before.get(prop, [])):]
            lines.append(f"  {prop}: {n} case(s), e.g. {new[:2]}")
        lines.append("  the example's requests, the last 12:")
        lines.extend(f"    {s}" for s in sent[-12:])
        raise AssertionError("\n".join(lines))


def run_property_fuzz(run: FuzzRun, examples: int, seed: str | None) -> None:
    runner = FuzzRunner(run.daemon.endpoint, run.report, alive=run.daemon.running)

    @settings(max_examples=examples, deadline=None, derandomize=seed is None, database=None,
              phases=(Phase.explicit, Phase.generate, *((Phase.shrink,) if SHRINK else ())),
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              print_blob=False)
    @given(scenarios(LIMITS))
    def every_example_holds(scenario: Scenario) -> None:
        run.play(runner, scenario)

    prop = every_example_holds if seed is None else hypothesis_seed(int(seed))(
        every_example_holds)
    t0 = time.monotonic()
    try:
        prop()
    except Exception as exc:  # hypothesis' falsifying example is in the exception's notes
        # A failure hypothesis could not repeat (e.g. the sweep killed the daemon during the
        # next example) comes as a group of what happened.
        inner = getattr(exc, "exceptions", [exc])[0]
        notes = "\n".join(getattr(exc, "__notes__", []) or getattr(inner, "__notes__", []))
        run.failure = ("".join(traceback.format_exception_only(type(inner), inner))[:4000]
                       + "\n" + notes[:4000])
    finally:
        runner.finish()
        runner.close()
        run.report.seconds = time.monotonic() - t0


def served_with_events(run: FuzzRun, collector: Collector) -> str | None:
    """A camera new to the daemon, on its own clock: ok, and its event's start reaches the
    PUB socket and the broker; None, or what went wrong."""
    run.death()
    camera = "after-the-fuzz"
    window = np.zeros(WINDOW, np.float32)
    with Client(run.daemon.endpoint, camera_id=camera, timeout=10, retries=1) as client:
        for i in range(3):
            client.infer(window, timestamp=1_700_000_000.0 + i)
    end = time.monotonic() + 15
    while time.monotonic() < end:
        pub, broker = collector.published()
        on_pub = any(f[0] == camera.encode() and msgpack.unpackb(f[1]).get("kind") == "start"
                     for f in pub if len(f) == 2)
        on_mqtt = any(t == f"stgcnd/{camera}/event" and b'"start"' in p for t, p, _ in broker)
        if on_pub and on_mqtt:
            return None
        time.sleep(0.1)
    return f"the start of {camera}'s event: on PUB {on_pub}, on MQTT {on_mqtt}"


def non_finite(value: Any, where: str = "") -> list[str]:
    """Paths to every NaN or infinity in a decoded message."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, f"{where}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite(v, f"{where}[{i}]")]
    return []


def bad_pub_messages(pub: list[list[bytes]]) -> list[str]:
    """Events messages that are not [topic, msgpack map] numbered one after another per run,
    with the camera as the topic and only finite numbers."""
    bad, last_seq = [], {}
    for frames in pub:
        try:
            assert len(frames) == 2, f"{len(frames)} frames"
            message = msgpack.unpackb(frames[1], raw=False)
            assert isinstance(message, dict), type(message).__name__
            run, seq = message["run"], message["seq"]
            assert seq == last_seq.get(run, seq - 1) + 1, f"seq {last_seq.get(run)} -> {seq}"
            last_seq[run] = seq
            if message["kind"] != "heartbeat":
                assert frames[0] == str(message["camera"]).encode(), frames[0][:80]
            assert not non_finite(message), non_finite(message)
        except Exception as exc:
            bad.append(f"{type(exc).__name__}: {exc}: {[f[:200] for f in frames]!r}")
    return bad


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")  # json.loads takes NaN and Infinity otherwise


def bad_mqtt_messages(messages: list[tuple[str, bytes, bool]]) -> list[str]:
    """MQTT messages that are not strict JSON objects (no NaN, no Infinity), but for the
    plain words: the status topic's `online`/`offline`, a class topic's `ON`/`OFF`, a feed
    topic's state."""
    bad = []
    for topic, payload, _ in messages:
        if topic == "stgcnd/status" and payload in (b"online", b"offline"):
            continue
        levels = topic.split("/")
        word = payload.decode(errors="replace")
        if levels[2:3] == ["class"] and len(levels) == 4 and word in ("ON", "OFF"):
            continue
        if levels[2:] == ["feed"] and word in FEED_STATES:
            continue
        try:
            body = json.loads(payload, parse_constant=_not_json)
            assert isinstance(body, dict), type(body).__name__
            assert topic.endswith(("/event", "/state")), topic
        except Exception as exc:
            bad.append(f"{type(exc).__name__}: {exc}: {topic!r} {payload[:200]!r}")
    return bad


@dataclass
class Outcome:
    run: FuzzRun
    final: str | None
    exit_code: int | None
    pub: list[list[bytes]]
    mqtt: list[tuple[str, bytes, bool]]
    log_events: list[dict[str, Any]]
    log_other: list[str]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    tmp: Path = tmp_path_factory.mktemp("property-fuzz")
    (tmp / "broker").mkdir()
    broker = Broker(tmp / "broker").start()
    events = f"ipc://{tmp / 'events.sock'}"
    daemon = Daemon(tmp, models=MODELS.format(broker=broker.url), events_endpoint=events,
                    max_message_bytes=MAX_MESSAGE_BYTES, max_cameras=128, idle_timeout=1.0,
                    queue_size=4)
    run = FuzzRun(daemon, FuzzReport(seed=int(SEED) if SEED else 0, planned=EXAMPLES))
    collector = None
    try:
        run.start()
        collector = Collector(events, broker)
        run_property_fuzz(run, EXAMPLES, SEED)
        final = served_with_events(run, collector)
        exit_code = daemon.stop(timeout=15)   # SIGTERM: the open events end (shutdown)
        time.sleep(1.0)                        # the last messages reach the subscribers
        pub, broker_messages = collector.published()
        log_events, log_other = log_lines(daemon)
        rep = run.report
        print(f"\nproperty fuzz ({'seed ' + SEED if SEED else 'derandomized'}): "
              f"{run.player.examples} examples, {rep.cases} requests in {rep.seconds:.1f} s; "
              f"({run.paused_s:.1f} s of pauses); deaths {len(run.deaths)}, lost "
              f"{rep.violation_counts['exactly one reply (none came)']}, duplicated "
              f"{rep.violation_counts['exactly one reply (an extra reply came)']}, internal "
              f"{rep.outcomes['internal']}; outcomes "
              f"{dict(rep.outcomes)}; seconds by kind "
              f"{ {k: round(v, 1) for k, v in rep.kind_seconds.most_common()} }; events on "
              f"PUB {len(pub)}, on MQTT {len(broker_messages)}")
        return Outcome(run, final, exit_code, pub, broker_messages, log_events, log_other)
    finally:
        if collector is not None:
            collector.close()
        daemon.close()
        broker.stop()


def test_every_example_holds(fuzzed: Outcome) -> None:
    """Hypothesis' verdict: the first failing example, its requests and what broke."""
    if fuzzed.run.failure is not None:
        pytest.fail(fuzzed.run.failure, pytrace=False)


def test_the_daemon_never_dies(fuzzed: Outcome) -> None:
    assert not fuzzed.run.deaths, f"{len(fuzzed.run.deaths)} death(s): {fuzzed.run.deaths[:3]}"
    assert fuzzed.exit_code == 0, f"exit code {fuzzed.exit_code} at SIGTERM"


def test_every_request_gets_exactly_one_reply_with_its_id(fuzzed: Outcome) -> None:
    failure = fuzzed.run.report.failure(
        "send blocked", "exactly one reply (none came)", "exactly one reply (an extra reply "
        "came)", "replies are protocol v1", "reply id = request id")
    assert failure is None, failure


def test_errors_are_stable_codes_never_internal(fuzzed: Outcome) -> None:
    failure = fuzzed.run.report.failure(
        "never internal", "stable error codes", "error messages say what was expected",
        "the protocol's code for the input")
    assert failure is None, failure


def test_the_fuzz_reached_predictions_and_events(fuzzed: Outcome) -> None:
    """The scenarios get past decoding: predictions, `ts` refusals, events on both sinks."""
    if fuzzed.run.failure is not None:
        pytest.skip("the run stopped at its first failing example (test_every_example_holds)")
    rep = fuzzed.run.report
    assert rep.cases >= EXAMPLES, (rep.cases, EXAMPLES)
    assert {"ok", "malformed", "unknown-model", "bad-shape"} <= set(rep.outcomes), rep.outcomes
    starts = [f for f in fuzzed.pub if len(f) == 2 and b"start" in f[1]]
    assert len(starts) > EXAMPLES // 10, f"{len(starts)} starts on PUB"
    assert len(fuzzed.mqtt) > EXAMPLES // 10, f"{len(fuzzed.mqtt)} MQTT messages"


def test_a_new_camera_is_served_and_its_events_reach_pub_and_mqtt(fuzzed: Outcome) -> None:
    assert fuzzed.final is None, fuzzed.final


def test_events_messages_are_well_formed(fuzzed: Outcome) -> None:
    bad = bad_pub_messages(fuzzed.pub)
    assert not bad, f"{len(bad)} of {len(fuzzed.pub)}, e.g. {bad[:3]}"


def test_mqtt_messages_are_strict_json(fuzzed: Outcome) -> None:
    bad = bad_mqtt_messages(fuzzed.mqtt)
    assert not bad, f"{len(bad)} of {len(fuzzed.mqtt)}, e.g. {bad[:3]}"


def test_the_log_is_json_lines_without_tracebacks(fuzzed: Outcome) -> None:
    assert not fuzzed.log_other, fuzzed.log_other[:3]
    crashed = [e for e in fuzzed.log_events if "exception" in e or
               e.get("event") == "request_crashed"]
    assert not crashed, f"{len(crashed)}, e.g. {crashed[:2]}"
    odd = [e for e in fuzzed.log_events if non_finite(e)]
    assert not odd, odd[:2]
