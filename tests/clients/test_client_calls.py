"""Client against a real ROUTER on an ipc:// socket: calls, Lazy Pirate retries, typed errors."""

from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest
from client_fakes import FRAMES, LABELS, FakeDaemon, FakeModelServer

from stgcnd_client import (
    BadReply,
    Busy,
    Client,
    ClientClosed,
    ClientError,
    CrossThreadUse,
    Expired,
    ServerError,
    ShuttingDown,
    Timeout,
)
from stgcnd_client.protocol import encode_reply

RNG = np.random.default_rng(5)


def window(dtype=np.float32) -> np.ndarray:
    return RNG.random((3, FRAMES, 2, 1)).astype(dtype)


def expected_logits(w: np.ndarray) -> np.ndarray:
    w = w.astype(np.float64)
    return np.array([w.sum(), w.mean()])


# --------------------------------------------------------------------------- calls


def test_hello_lists_the_models(serve, endpoint):
    serve()
    with Client(endpoint, camera_id="aisle-3") as client:
        info = client.hello()
    assert info.server == "fake-0" and info.protocol == 1 and info.camera == "aisle-3"
    (model,) = info.models
    assert model.name == "single" and model.input_shape == (3, FRAMES, 2, 1)
    assert model.labels == tuple(LABELS) and model.num_class == 2 and model.stride == 1
    assert model.frame_shape == (3, 2, 1)
    assert info.default_model is model and info.model() is model and info.model("single") is model
    with pytest.raises(KeyError, match="single"):
        info.model("other")


def test_infer_sends_the_window_and_returns_the_prediction(serve, endpoint):
    daemon = serve()
    w = window()
    with Client(endpoint, camera_id="cam-a", timeout=2.0) as client:
        result = client.infer(w)
    logits = expected_logits(w)
    np.testing.assert_allclose(result.logits, logits, rtol=1e-6)
    probs = np.exp(logits - logits.max())
    np.testing.assert_allclose(result.probs, probs / probs.sum(), rtol=1e-6)
    assert result.label == int(np.argmax(logits)) and result.label_name == LABELS[result.label]
    assert result.model == "single"
    assert result.timings == {"queue_ms": 0.5, "compute_ms": 1.5, "total_ms": 2.0}
    assert result.client_ms > 0
    ((_, req),) = daemon.received
    assert req.op == "infer" and req.camera == "cam-a" and req.model is None
    np.testing.assert_array_equal(req.arrays[0], w)
    # the server is told how long this attempt will wait: within the caller's 2 s
    assert 0 < req.timeout_ms <= 2000


def test_float64_and_float16_windows(serve, endpoint):
    daemon = serve()
    w64 = window(np.float64)
    w16 = window(np.float16)
    with Client(endpoint) as client:
        client.infer(w64, model="single")
        client.infer(w16)
    sent64, sent16 = (req.arrays[0] for _, req in daemon.received)
    assert sent64.dtype == np.float32
    np.testing.assert_array_equal(sent64, w64.astype(np.float32))
    assert sent16.dtype == np.float16
    np.testing.assert_array_equal(sent16, w16)
    assert daemon.received[0][1].model == "single"


def test_push_returns_none_until_the_window_is_full(serve, endpoint):
    serve()
    frames = [RNG.random((3, 2, 1)).astype(np.float32) for _ in range(FRAMES + 1)]
    with Client(endpoint, camera_id="cam-p") as client:
        early = [client.push(f) for f in frames[: FRAMES - 1]]
        first = client.push(frames[FRAMES - 1])
        second = client.push(frames[FRAMES])
    assert early == [None] * (FRAMES - 1)
    assert first is not None and second is not None
    np.testing.assert_allclose(
        first.logits, expected_logits(np.stack(frames[:FRAMES], axis=1)), rtol=1e-6
    )
    np.testing.assert_allclose(
        second.logits, expected_logits(np.stack(frames[1:], axis=1)), rtol=1e-6
    )
    assert (first.seq, first.frames) == (FRAMES, FRAMES)
    assert second.seq == FRAMES + 1


def test_reset_ping_stats(serve, endpoint):
    daemon = serve()
    with Client(endpoint, camera_id="cam-r") as client:
        assert client.reset() == ["single"]
        assert client.reset(model="single") == ["single"]
        assert client.ping() > 0
        assert client.stats() == {"requests": 1}
    assert [req.op for _, req in daemon.received] == ["reset", "reset", "ping", "stats"]
    assert [req.model for _, req in daemon.received][:2] == [None, "single"]


def test_request_ids_increase_per_client(serve, endpoint):
    daemon = serve()
    with Client(endpoint) as client:
        for _ in range(3):
            client.ping()
    ids = [req.id for _, req in daemon.received]
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_bad_arguments_fail_before_sending(endpoint):
    with Client(endpoint) as client:
        with pytest.raises(ValueError, match=r"\(3, T, V, M\)"):
            client.infer(np.zeros((3, 4, 2), np.float32))
        with pytest.raises(ValueError, match=r"\(3, V, M\)"):
            client.push(np.zeros((3, 4, 2, 1), np.float32))
        with pytest.raises(TypeError):
            client.infer(np.array([["a"]]))
    with pytest.raises(ValueError):
        Client("localhost:5555")
    with pytest.raises(ValueError):
        Client(endpoint, timeout=0)


# --------------------------------------------------------------------------- Lazy Pirate


class DropFirst:
    """Ignores the first ``n`` requests (as a daemon that restarted would), then answers."""

    def __init__(self, n: int = 1) -> None:
        self.n = n
        self.model = FakeModelServer()

    def __call__(self, req):
        if self.n > 0:
            self.n -= 1
            return self.first(req)
        return self.model(req)

    def first(self, req) -> list:
        """The reply to one of the first ``n`` requests: none."""
        return []


def test_lost_request_is_resent_on_a_fresh_socket(serve, endpoint):
    daemon = serve(DropFirst(1))
    w = window()
    with Client(endpoint, timeout=2.0, retries=3) as client:
        result = client.infer(w)
        assert client.reconnects == 1
    np.testing.assert_allclose(result.logits, expected_logits(w), rtol=1e-6)
    (first_id, first), (second_id, second) = daemon.received
    assert first.id == second.id  # a resend is the same request
    assert first_id != second_id  # ... from a fresh DEALER
    np.testing.assert_array_equal(second.arrays[0], w)
    # each attempt announces only its share of the deadline
    assert first.timeout_ms + second.timeout_ms <= 2000 + 1


def test_stale_replies_are_discarded(serve, endpoint):
    model = FakeModelServer()

    def late_then_real(req):
        stale = encode_reply(req.id - 1, {"model": "stale", "ready": True})
        garbage = [b"\xc1not msgpack"]
        return [stale, garbage, *model(req)]

    serve(late_then_real)
    w = window()
    with Client(endpoint) as client:
        client.ping()
        result = client.infer(w)
    assert result.model == "single"
    np.testing.assert_allclose(result.logits, expected_logits(w), rtol=1e-6)


def test_no_reply_times_out_after_the_retry_budget(serve, endpoint):
    daemon = serve(lambda req: [])
    client = Client(endpoint, timeout=0.9, retries=2)
    start = time.monotonic()
    with pytest.raises(Timeout, match="no reply") as info:
        client.ping()
    elapsed = time.monotonic() - start
    assert "3 attempt(s)" in str(info.value)
    assert elapsed >= 0.9
    assert elapsed < 5  # bounded by the deadline, not by the retries piling up
    requests = [req for _, req in daemon.received]
    identities = {identity for identity, _ in daemon.received}
    assert len(requests) == 3 and len(identities) == 3
    assert len({req.id for req in requests}) == 1
    assert sum(req.timeout_ms for req in requests) <= 900 + 1
    # the client stays usable once the server answers again
    daemon.handler = FakeModelServer()
    assert client.ping() > 0
    client.close()


def test_missing_daemon_is_reported_as_unreachable(endpoint):
    with Client(endpoint, timeout=0.4, retries=1) as client, pytest.raises(
        Timeout, match="could not reach"
    ) as info:
        client.ping()
    assert endpoint in str(info.value)


def test_call_waits_for_a_daemon_that_starts_late(endpoint):
    daemon = FakeDaemon(endpoint, FakeModelServer())
    timer = threading.Timer(0.3, daemon.start)
    timer.start()
    try:
        with Client(endpoint, timeout=5.0) as client:
            assert client.ping() > 0
    finally:
        timer.join()
        daemon.stop()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("code", "exc_type"),
    [
        ("busy", Busy),
        ("shutting-down", ShuttingDown),
        ("bad-shape", ServerError),
        ("unknown-model", ServerError),
        ("internal", ServerError),
    ],
)
def test_error_replies_raise_typed_exceptions(serve, endpoint, code, exc_type):
    serve(lambda req: [encode_reply(req.id, error=(code, f"{code} happened"))])
    with Client(endpoint) as client, pytest.raises(exc_type) as info:
        client.infer(window())
    assert isinstance(info.value, ServerError) and isinstance(info.value, ClientError)
    assert info.value.code == code and info.value.message == f"{code} happened"
    assert type(info.value) is exc_type


class ExpireFirst(DropFirst):
    """Answers the first ``n`` requests `expired` (too little time for them), then answers."""

    def first(self, req) -> list:
        return [encode_reply(req.id, error=("expired", "a batch of 1 takes ~2000.0 ms"))]


def test_expired_with_time_left_is_retried_at_once_with_all_of_it(serve, endpoint):
    """#32.3: the first attempt gets a share of the timeout (a quarter, with 3 retries); its
    `expired` does not end the call: the same request goes again on the same socket with all
    that is left, so the caller's timeout is what it waits, whatever the attempts."""
    daemon = serve(ExpireFirst(1))
    w = window()
    with Client(endpoint, timeout=4.0, retries=3) as client:
        result = client.infer(w)
        assert client.reconnects == 0
    np.testing.assert_allclose(result.logits, expected_logits(w), rtol=1e-6)
    (first_id, first), (second_id, second) = daemon.received
    assert first.id == second.id and first_id == second_id  # same request, same socket
    assert first.timeout_ms == pytest.approx(1000, abs=5)  # 4 s over 4 attempts
    assert 3900 < second.timeout_ms <= 4000                # everything that was left


def test_expired_with_all_the_time_left_is_raised_in_the_callers_terms(serve, endpoint):
    daemon = serve(ExpireFirst(10))
    with Client(endpoint, timeout=5.0) as client, pytest.raises(Expired) as info:
        client.push(window()[:, 0])
    assert len(daemon.received) == 2  # a share, then everything left; not 4 shares
    assert info.value.code == "expired" and isinstance(info.value, ServerError)
    text = str(info.value)
    assert "within timeout=5 s" in text and "a batch of 1 takes ~2000.0 ms" in text
    assert "timeout_ms" not in text and "longer timeout (seconds)" in text


def test_without_retries_the_one_attempt_has_all_the_time(serve, endpoint):
    daemon = serve(ExpireFirst(10))
    with Client(endpoint, timeout=2.0, retries=0) as client, pytest.raises(Expired):
        client.infer(window())
    ((_, only),) = daemon.received
    assert only.timeout_ms == pytest.approx(2000, abs=5)


def test_a_timeout_must_be_a_finite_number_of_seconds(endpoint):
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number of seconds"):
            Client(endpoint, timeout=bad)
    with Client(endpoint) as client, pytest.raises(ValueError, match="seconds"):
        client.ping(timeout=float("inf"))


def test_error_reply_without_id_answers_the_outstanding_request(serve, endpoint):
    serve(lambda req: [encode_reply(None, error=("malformed", "header is not a map"))])
    with Client(endpoint) as client, pytest.raises(ServerError) as info:
        client.ping()
    assert info.value.code == "malformed"


def test_reply_in_another_protocol_version_is_a_bad_reply(serve, endpoint):
    serve(lambda req: [[msgpack.packb({"v": 2, "id": req.id, "ok": True, "result": {}})]])
    with Client(endpoint) as client, pytest.raises(BadReply, match="version 2"):
        client.ping()


def test_prediction_reply_missing_fields_is_a_bad_reply(serve, endpoint):
    serve(lambda req: [encode_reply(req.id, {"model": "single"})])
    with Client(endpoint) as client, pytest.raises(BadReply, match="logits"):
        client.infer(window())


# --------------------------------------------------------------------------- threads, lifecycle


def test_client_refuses_calls_from_a_second_thread(serve, endpoint):
    serve()
    client = Client(endpoint)
    client.ping()  # this thread now owns the client
    errors: list[BaseException] = []

    def other_thread():
        try:
            client.ping()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], CrossThreadUse)
    assert "one Client per camera thread" in str(errors[0])
    assert client.ping() > 0  # the owner is unaffected
    client.close()


def test_client_made_in_one_thread_can_serve_another(serve, endpoint):
    serve()
    results: list[float] = []
    with Client(endpoint) as client:
        t = threading.Thread(target=lambda: results.append(client.ping()))
        t.start()
        t.join()
    assert len(results) == 1 and results[0] > 0


def test_close_is_idempotent_and_final(serve, endpoint):
    serve()
    client = Client(endpoint)
    client.ping()
    client.close()
    client.close()
    with pytest.raises(ClientClosed):
        client.ping()
    assert "closed" in repr(client)
