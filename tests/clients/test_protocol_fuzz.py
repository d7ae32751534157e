"""decode_request against seeded hostile input: only a Request or a ProtocolError may come out.

The daemon turns any other exception into `internal` with a nil id (issue #12 item 3), so a
crash here is a daemon bug. TEST_FUZZ_SEED replays a run; TEST_FUZZ_CASES sets its size.
"""

from __future__ import annotations

import os
import random

import msgpack
import numpy as np
import pytest

from stgcnd_client.protocol import (
    ErrorCode,
    Limits,
    ProtocolError,
    Request,
    check_frame,
    check_window,
    decode_request,
)
from tests.fuzz_messages import Case, Generator, expected_reply_id

WINDOW = (3, 16, 33, 1)
LIMITS = Limits(max_message_bytes=256 * 1024)
SEED = int(os.environ.get("TEST_FUZZ_SEED", random.SystemRandom().randrange(2**32)))
CASES = int(os.environ.get("TEST_FUZZ_CASES", "3000"))


def decode_like_the_daemon(frames: list[bytes]) -> str:
    """'ok' or the error code: decode, then the payload checks the daemon runs per op."""
    try:
        req = decode_request(frames, LIMITS)
        assert isinstance(req, Request)
        if req.op == "infer":
            check_window(req.arrays[0], WINDOW)
        elif req.op == "push":
            check_frame(req.arrays[0], WINDOW)
    except ProtocolError as exc:
        assert isinstance(exc.code, ErrorCode) and exc.message
        if exc.code in (ErrorCode.BAD_SHAPE, ErrorCode.NON_FINITE, ErrorCode.BAD_DTYPE) and \
                exc.req_id is None:
            pass  # the payload checks do not know the id; the daemon adds it
        else:
            expected = expected_reply_id(frames, LIMITS)
            assert exc.req_id == expected, f"error id {exc.req_id} != header id {expected}"
        return exc.code.value
    assert req.id == expected_reply_id(frames, LIMITS)
    return "ok"


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """Byte-level damage to a message: flips, cuts, inserts, dropped or duplicated frames."""
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randrange(1, 4)):
        how = rng.randrange(5)
        i = rng.randrange(len(frames)) if frames else 0
        if how == 0 and frames and frames[i]:
            frames[i][rng.randrange(len(frames[i]))] = rng.randrange(256)
        elif how == 1 and frames:
            frames[i] = frames[i][:rng.randrange(len(frames[i]) + 1)]
        elif how == 2 and frames:
            at = rng.randrange(len(frames[i]) + 1)
            frames[i][at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif how == 3 and len(frames) > 1:
            del frames[rng.randrange(1, len(frames))]
        elif frames:
            frames.append(bytearray(frames[-1]))
    return [bytes(f) for f in frames]


def test_decode_request_only_raises_protocol_error():
    rng = random.Random(SEED)
    gen = Generator(rng, WINDOW, LIMITS)
    seen: dict[str, int] = {}
    for n, case in enumerate(gen.stream(CASES)):
        for frames in (case.frames, mutate(rng, case.frames)):
            try:
                outcome = decode_like_the_daemon(frames)
            except Exception as exc:
                pytest.fail(f"seed {SEED} case {n}: {type(exc).__name__}: {exc}\n"
                            f"{case.describe()}\nframes={[f[:80] for f in frames]!r}")
            # "ok" here may still become e.g. unknown-model in the daemon, which knows models.
            if frames is case.frames and case.allowed is not None and outcome != "ok":
                assert outcome in case.allowed, (
                    f"seed {SEED} case {n}: got {outcome}, allowed {sorted(case.allowed)}: "
                    f"{case.describe()}")
            seen[outcome] = seen.get(outcome, 0) + 1
    # The generators must reach deep: valid requests and most error codes.
    assert {"ok", "malformed", "bad-shape", "bad-dtype", "bad-size", "non-finite",
            "too-large", "unsupported-version", "unknown-op"} <= set(seen), (SEED, seen)


@pytest.mark.parametrize("shape", [[2**63, 0], [0, 2**63], [2**32, 2**32, 0], [2**64 - 1, 0],
                                   [2**22] * 7 + [0], [0, 2**40, 2**40]])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_array_with_huge_dimension_is_bad_shape_with_the_id(shape, dtype):
    header = {"v": 1, "op": "infer", "id": 42, "camera": "c", "model": None,
              "timeout_ms": None, "arrays": [{"dtype": dtype, "shape": shape}]}
    with pytest.raises(ProtocolError) as info:
        decode_request([msgpack.packb(header), b""], LIMITS)
    assert (info.value.code, info.value.req_id) == (ErrorCode.BAD_SHAPE, 42)
    assert str(shape) in info.value.message


def test_empty_arrays_within_the_bounds_still_decode():
    header = {"v": 1, "op": "infer", "id": 1, "camera": "c", "arrays": [
        {"dtype": "float32", "shape": [3, 0, 33, 1]}]}
    req = decode_request([msgpack.packb(header), b""], LIMITS)
    assert req.arrays[0].shape == (3, 0, 33, 1)
    bound = LIMITS.max_message_bytes // 4
    header["arrays"] = [{"dtype": "float32", "shape": [bound, 0]}]
    assert decode_request([msgpack.packb(header), b""], LIMITS).arrays[0].shape == (bound, 0)
    header["arrays"] = [{"dtype": "float32", "shape": [bound + 1, 0]}]
    with pytest.raises(ProtocolError, match="bad-shape"):
        decode_request([msgpack.packb(header), b""], LIMITS)


@pytest.mark.parametrize("frame", ["text", 7, None, np.zeros((2, 2), np.float32)[:, 0]])
def test_frames_that_are_not_byte_buffers_are_malformed(frame):
    with pytest.raises(ProtocolError) as info:
        decode_request([frame])
    assert info.value.code == ErrorCode.MALFORMED


def test_generator_cases_describe_themselves():
    case = Generator(random.Random(1), WINDOW, LIMITS).valid()[0]
    assert isinstance(case, Case) and "valid" in case.describe()
