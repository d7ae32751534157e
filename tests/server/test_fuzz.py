"""Protocol fuzz suite against one real `stgcnd serve` (issue #12): seeded, bounded, black-box.

Thousands of hostile requests (tests/fuzz_messages.py) go through real ZeroMQ sockets to one
daemon subprocess on two tiny CPU models. Every case must get exactly one reply, carrying the
request's id whenever its header had an integer id, with a stable error code (never
`internal`) or, for predictions, finite logits. Afterwards the daemon must be alive, answer
ping, and have logged JSON lines only, with bad requests rate-limited.

    TEST_FUZZ_SEED=123 python -m pytest -q tests/server/test_fuzz.py     # replay a run
    TEST_FUZZ_CASES=20000 python -m pytest -q tests/server/test_fuzz.py  # a bigger deep run
    TEST_FUZZ_LONG=1 python -m pytest -q -m slow tests/server/test_fuzz.py  # 50k cases

Each test below checks one property of the same run, so a failure names the broken property;
the seed is in every failure message. Each runs twice: on a fast run of 500 cases (enough to
reach every outcome below with any seed) and, in the slow tier, on a deep run of 3,000.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd_client import Client, ServerError
from stgcnd_client.protocol import ErrorCode, Limits, ProtocolError
from stgcnd_client.wire import decode_reply
from tests.fuzz_messages import LOAD_CODES, Case, Generator
from tests.server.daemon_harness import Daemon

FRAMES = 16
WINDOW = (3, FRAMES, 33, 1)
MAX_MESSAGE_BYTES = 256 * 1024  # small, so oversized cases stay cheap
LIMITS = Limits(max_message_bytes=MAX_MESSAGE_BYTES)
FAST_CASES = int(os.environ.get("TEST_FUZZ_FAST_CASES", "500"))
DEEP_CASES = int(os.environ.get("TEST_FUZZ_CASES", "3000"))
LONG_CASES = int(os.environ.get("TEST_FUZZ_LONG_CASES", "50000"))
REPLY_TIMEOUT_S = 10.0     # one reply; an inference on a loaded 2-core box takes milliseconds
GRACE_S = 1.0              # after the last case: no stray replies may follow
STABLE_CODES = frozenset(code.value for code in ErrorCode) - {ErrorCode.INTERNAL.value}
MAX_EXAMPLES = 8           # violations shown per property


def fuzz_seed() -> int:
    raw = os.environ.get("TEST_FUZZ_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(2**32)


MODELS = (
    f'[[models]]\nname = "demo"\nframes = {FRAMES}\nbackend = "onnxruntime"\n'
    'threads = 1\ndemo = true\nlabels = ["normal", "shoplifting"]\n'
    # A second model so that "reset with model nil" has more than one model to reset (the same
    # network: the daemon builds it once).
    f'[[models]]\nname = "demo2"\nframes = {FRAMES}\nbackend = "onnxruntime"\n'
    'threads = 1\ndemo = true\n'
)


def fuzz_daemon(tmp) -> Daemon:
    return Daemon(tmp, models=MODELS, reuse_engines=True, max_message_bytes=MAX_MESSAGE_BYTES,
                  max_cameras=16, idle_timeout=2.0, queue_size=4)


@dataclass
class FuzzReport:
    seed: int
    planned: int = 0  # cases asked for
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    kind_seconds: Counter = field(default_factory=Counter)
    # property -> examples (each one line, with the case)
    violations: dict[str, list[str]] = field(default_factory=dict)
    violation_counts: Counter = field(default_factory=Counter)
    stalled: bool = False

    def violate(self, prop: str, text: str) -> None:
        self.violation_counts[prop] += 1
        examples = self.violations.setdefault(prop, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(text)

    def failure(self, *props: str) -> str | None:
        found = [p for p in props if self.violation_counts[p]]
        if not found:
            return None
        lines = [f"fuzz seed {self.seed} ({self.cases} cases, {self.seconds:.1f} s; replay with "
                 f"TEST_FUZZ_SEED={self.seed}):"]
        for p in found:
            lines.append(f"  {p}: {self.violation_counts[p]} case(s), e.g.")
            lines.extend(f"    - {e}" for e in self.violations[p])
        lines.append(f"  outcomes: {dict(self.outcomes)}")
        return "\n".join(lines)


class FuzzRunner:
    """Sends cases one at a time and checks each reply.

    Cases with a fresh integer id use one long-lived DEALER: any reply that is not for the
    current case is a stray. A case whose reply cannot be told apart by id (no integer id, or
    a repeated one) gets a DEALER of its own, polled for strays until the run ends.
    `alive`: whether the daemon process still runs, so that a reply is not awaited from a
    dead one for REPLY_TIMEOUT_S (tests/server/test_property_fuzz.py restarts it).
    """

    def __init__(self, endpoint: str, report: FuzzReport,
                 alive: Callable[[], bool] | None = None) -> None:
        self.endpoint = endpoint
        self.report = report
        self.alive = alive
        self.ctx = zmq.Context.instance()
        self.main = self._socket()
        self.main_ids: dict[int, str] = {}  # id -> case description
        self.own: list[tuple[zmq.Socket, str]] = []  # sockets of finished one-off cases
        self.seen_ids: set[int] = set()

    def _socket(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100)
        s.setsockopt(zmq.RCVHWM, 100)
        s.connect(self.endpoint)
        return s

    def close(self) -> None:
        self.main.close(0)
        for s, _ in self.own:
            s.close(0)
        self.own.clear()

    def run(self, case: Case) -> None:
        rep = self.report
        rep.cases += 1
        rep.kinds[case.kind] += 1
        started = time.monotonic()
        try:
            self._run(case)
        finally:
            rep.kind_seconds[case.kind] += time.monotonic() - started

    def _run(self, case: Case) -> None:
        rep = self.report
        rid = case.reply_id
        shared = rid is not None and rid >= 1_000_000 and rid not in self.seen_ids
        if rid is not None:
            self.seen_ids.add(rid)
        sock = self.main if shared else self._socket()
        desc = case.describe()
        try:
            sock.send_multipart(case.frames, zmq.NOBLOCK)
        except zmq.Again:
            if not sock.poll(int(REPLY_TIMEOUT_S * 1000), zmq.POLLOUT):
                rep.violate("send blocked", desc)
                rep.stalled = True
                return
            sock.send_multipart(case.frames)
        if shared:
            self.main_ids[rid] = desc
        frames = self._wait(sock, rid if shared else None, desc)
        if not shared:
            if len(self.own) > 200:  # bound open sockets: the oldest have had time for strays
                old, _ = self.own.pop(0)
                self._check_strays(old, "closed", 0)
                old.close(0)
            self.own.append((sock, desc))
        if frames is None:
            rep.violate("exactly one reply (none came)", desc)
            rep.stalled = True
            return
        self._check_reply(case, frames, desc)

    def _wait(self, sock: zmq.Socket, shared_id: int | None, desc: str) -> list[bytes] | None:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if sock is not self.main:
            poller.register(self.main, zmq.POLLIN)
        for other, _ in self.own:
            poller.register(other, zmq.POLLIN)
        while time.monotonic() < deadline:
            if self.alive is not None and not self.alive() and not poller.poll(100):
                return None  # dead, and nothing it sent before it died is left to read
            wait_s = deadline - time.monotonic()
            if self.alive is not None:
                wait_s = min(wait_s, 0.2)
            ready = dict(poller.poll(max(1, int(wait_s * 1000))))
            for s in ready:
                if s is sock and s is not self.main:
                    return s.recv_multipart()
                if s is self.main:
                    frames = s.recv_multipart()
                    if shared_id is not None and _reply_id(frames) == shared_id:
                        return frames
                    self._stray(frames, self.main_ids.get(_reply_id(frames), "?"))
                else:
                    self._stray(s.recv_multipart(), dict(self.own).get(s, "?"))
        return None

    def _stray(self, frames: list[bytes], owner: str) -> None:
        self.report.violate("exactly one reply (an extra reply came)",
                            f"reply {frames[0][:120]!r} after the case {owner}")

    def _check_strays(self, sock: zmq.Socket, owner: str, timeout_ms: int) -> None:
        while sock.poll(timeout_ms, zmq.POLLIN):
            self._stray(sock.recv_multipart(), owner)
            timeout_ms = 0

    def finish(self) -> None:
        """Wait out the grace period for strays on every socket."""
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end:
            self._check_strays(self.main, "main socket", 50)
            for s, desc in self.own:
                self._check_strays(s, desc, 0)

    def _check_reply(self, case: Case, frames: list[bytes], desc: str) -> None:
        rep = self.report
        try:
            reply = decode_reply(frames)
        except ProtocolError as exc:
            rep.violate("replies are protocol v1", f"{exc} for {desc}")
            return
        if reply.id != case.reply_id:
            rep.violate("reply id = request id", f"reply id {reply.id!r}, expected "
                        f"{case.reply_id!r}: {desc}")
        if reply.ok:
            outcome = "ok"
            logits = reply.result.get("logits")
            probs = reply.result.get("probs")
            if logits is not None and not all(math.isfinite(v) for v in [*logits, *probs]):
                rep.violate("predictions are finite",
                            f"logits {logits} probs {probs} label "
                            f"{reply.result.get('label')}: {desc}")
        else:
            assert reply.error is not None
            outcome = reply.error.code
            if outcome == ErrorCode.INTERNAL.value:
                rep.violate("never internal", f"{reply.error.message[:200]!r}: {desc}")
            elif outcome not in STABLE_CODES:
                rep.violate("stable error codes", f"code {outcome!r}: {desc}")
            elif not reply.error.message:
                rep.violate("error messages say what was expected", desc)
        rep.outcomes[outcome] += 1
        if case.allowed is not None and outcome not in case.allowed | LOAD_CODES \
                and outcome != ErrorCode.INTERNAL.value:
            rep.violate("the protocol's code for the input",
                        f"got {outcome}, expected one of {sorted(case.allowed)}: {desc}")


def _reply_id(frames: list[bytes]) -> int | None:
    try:
        return decode_reply(frames).id
    except ProtocolError:
        return None


def run_fuzz(daemon: Daemon, seed: int, cases: int, time_limit_s: float) -> FuzzReport:
    report = FuzzReport(seed=seed, planned=cases)
    gen = Generator(random.Random(seed), WINDOW, LIMITS)
    runner = FuzzRunner(daemon.endpoint, report)
    t0 = time.monotonic()
    try:
        for case in gen.stream(cases):
            runner.run(case)
            if report.stalled or time.monotonic() - t0 > time_limit_s:
                break
        runner.finish()
    finally:
        runner.close()
        report.seconds = time.monotonic() - t0
    return report


def check_survival(daemon: Daemon, report: FuzzReport) -> None:
    """The daemon is alive and serving after the run (recorded as violations)."""
    if daemon.proc is None or daemon.proc.poll() is not None:
        report.violate("daemon alive", f"exit code {daemon.proc and daemon.proc.returncode}")
        return
    try:
        with Client(daemon.endpoint, camera_id="after-fuzz", timeout=10, retries=1) as c:
            c.ping()
            info = c.hello()
            assert [m.name for m in info.models] == ["demo", "demo2"]
    except Exception as exc:
        report.violate("daemon answers after the run", f"{type(exc).__name__}: {exc}")


def log_lines(daemon: Daemon) -> tuple[list[dict], list[str]]:
    events, other = [], []
    for line in daemon.log_path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        (events if isinstance(event, dict) else other).append(event if isinstance(
            event, dict) else line)
    return events, other


def await_stats_tick(daemon: Daemon) -> None:
    """Wait for one stats tick after now, which logs (then flushes) the error log's suppressed
    counts: it logs the latency of an inference made now, and a ping answered after that line
    is seen means the tick is over (one loop thread runs ticks and requests)."""
    camera = f"tick-{time.monotonic_ns()}"
    deadline = time.monotonic() + 30
    with Client(daemon.endpoint, camera_id=camera, timeout=10, retries=1) as c:
        while True:
            try:
                c.infer(np.zeros(WINDOW, np.float32), model="demo")
                break
            except ServerError as exc:  # busy: the fuzz's cameras, just now, hold every slot
                assert exc.code == "busy" and time.monotonic() < deadline, exc
                time.sleep(0.1)
        while not any(e.get("event") == "latency" and e.get("camera") == camera
                      for e in log_lines(daemon)[0]):
            assert time.monotonic() < deadline, "no latency line within 30 s (stats ticks: 1 s)"
            time.sleep(0.05)
        c.ping()


def rejected_log_bound(seconds: float) -> int:
    """Bad-request log lines allowed for a run: bounded by time, never by request count."""
    return 50 + int(2 * seconds)


# -- the fast run (the fast tier) and the deep run (the slow tier) -----------------------------

@pytest.fixture(scope="module", params=[
    pytest.param(FAST_CASES, id="fast"),
    pytest.param(DEEP_CASES, id="deep", marks=pytest.mark.slow)])
def fuzzed(request, tmp_path_factory):
    seed = fuzz_seed()
    print(f"stgcnd fuzz seed {seed} (TEST_FUZZ_SEED={seed} replays it)")
    daemon = fuzz_daemon(tmp_path_factory.mktemp("fuzz")).start()
    try:
        report = run_fuzz(daemon, seed, request.param, time_limit_s=240.0)
        print(f"fuzz: {report.cases} cases in {report.seconds:.1f} s; outcomes "
              f"{dict(report.outcomes)}; seconds by kind "
              f"{ {k: round(v, 2) for k, v in report.kind_seconds.most_common()} }")
        check_survival(daemon, report)
        await_stats_tick(daemon)  # suppressed-count lines are flushed
        events, other = log_lines(daemon)
        yield daemon, report, events, other
    finally:
        daemon.stop(timeout=15)
        daemon.close()


def _assert_ok(report: FuzzReport, *props: str) -> None:
    message = report.failure(*props)
    assert message is None, message


def test_fuzz_ran_deep(fuzzed):
    _, report, _, _ = fuzzed
    assert report.cases >= min(report.planned, 500), f"seed {report.seed}: {report.cases} cases"
    # The generators reach past decoding: predictions, and the daemon-side checks.
    assert {"ok", "malformed", "bad-shape", "non-finite", "unknown-model"} <= set(
        report.outcomes), f"seed {report.seed}: {dict(report.outcomes)}"


def test_every_request_gets_exactly_one_reply(fuzzed):
    _, report, _, _ = fuzzed
    _assert_ok(report, "send blocked", "exactly one reply (none came)",
               "exactly one reply (an extra reply came)", "replies are protocol v1")


def test_reply_carries_the_request_id(fuzzed):
    _assert_ok(fuzzed[1], "reply id = request id")


def test_errors_are_stable_codes_never_internal(fuzzed):
    _assert_ok(fuzzed[1], "never internal", "stable error codes",
               "error messages say what was expected")


def test_errors_name_the_protocol_code_for_the_input(fuzzed):
    _assert_ok(fuzzed[1], "the protocol's code for the input")


def test_predictions_are_finite(fuzzed):
    """Issue #12 item 4: huge finite inputs (3e38) must not come back as NaN predictions."""
    _assert_ok(fuzzed[1], "predictions are finite")


def test_daemon_survives_the_fuzz(fuzzed):
    _assert_ok(fuzzed[1], "daemon alive", "daemon answers after the run")


def test_log_is_json_lines_without_tracebacks(fuzzed):
    _, report, events, other = fuzzed
    assert not other, f"seed {report.seed}: non-JSON log lines, e.g. {other[:3]}"
    crashed = [e for e in events if e.get("event") == "request_crashed"]
    assert not crashed, f"seed {report.seed}: {len(crashed)} request_crashed, e.g. {crashed[:2]}"


def test_bad_requests_are_logged_rate_limited(fuzzed):
    """Issue #12 item 6: thousands of bad requests (many from invented camera ids) must not
    make thousands of log lines; the rate limit holds per daemon, not per camera id."""
    _, report, events, _ = fuzzed
    rejected = [e for e in events if e.get("event") == "request_rejected"]
    errors = sum(n for code, n in report.outcomes.items() if code != "ok")
    bound = rejected_log_bound(report.seconds)
    by_client = Counter(str(e.get("client", e.get("camera"))) for e in rejected)
    print(f"fuzz: {len(rejected)} request_rejected lines for {errors} error replies")
    assert len(rejected) <= bound, (
        f"seed {report.seed}: {len(rejected)} request_rejected lines for {errors} error "
        f"replies in {report.seconds:.0f} s (bound {bound}); top senders "
        f"{by_client.most_common(5)}")


def test_invented_camera_ids_do_not_bypass_the_log_rate_limit(fuzzed):
    """Issue #12 item 6: 1,000 bad requests, each from a camera id never seen before."""
    daemon, report, _, _ = fuzzed
    before = sum(1 for e in log_lines(daemon)[0] if e.get("event") == "request_rejected")
    sent, t0 = 1000, time.monotonic()
    with Client(daemon.endpoint, camera_id="unused") as probe:
        probe.ping()
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(daemon.endpoint)
    try:
        got = 0
        for i in range(sent):
            s.send_multipart([msgpack.packb({
                "v": 1, "op": "reset", "id": i, "camera": f"liar-{i}-{report.seed}",
                "model": "no-such-model", "timeout_ms": None, "arrays": []})])
            if s.poll(REPLY_TIMEOUT_S * 1000):
                got += decode_reply(s.recv_multipart()).error.code == "unknown-model"
    finally:
        s.close(0)
    assert got == sent  # each request_rejected line is written before its reply is sent
    after = sum(1 for e in log_lines(daemon)[0] if e.get("event") == "request_rejected")
    bound = rejected_log_bound(time.monotonic() - t0)
    assert after - before <= bound, (
        f"{after - before} request_rejected lines for {sent} bad requests from {sent} invented "
        f"camera ids (bound {bound}): the rate limit is per camera id, not per daemon")


# -- the long run (opt-in) ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TEST_FUZZ_LONG"),
                    reason="set TEST_FUZZ_LONG=1 for the long fuzz run (50k cases)")
@pytest.mark.timeout(3600)
def test_long_fuzz_run(tmp_path):
    seed = fuzz_seed()
    print(f"stgcnd fuzz seed {seed}")
    daemon = fuzz_daemon(tmp_path).start()
    try:
        report = run_fuzz(daemon, seed, LONG_CASES, time_limit_s=3000.0)
        check_survival(daemon, report)
        await_stats_tick(daemon)
        events, other = log_lines(daemon)
    finally:
        code = daemon.stop(timeout=15)
        daemon.close()
    _assert_ok(report, *report.violation_counts)
    assert code == 0, f"seed {seed}: daemon exit code {code}"
    assert not other, other[:3]
    rejected = sum(1 for e in events if e.get("event") == "request_rejected")
    assert rejected <= rejected_log_bound(report.seconds), (seed, rejected)
