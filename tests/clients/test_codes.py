"""stgcnd_client.codes, the one table of what each error code and reason means and what a
client does, and the order of the checks: complete, so that the documents made from it
(`stgcnd docs`) say every code and reason."""

from __future__ import annotations

import re

import pytest

from stgcnd_client.codes import CHECK_ORDER, ERRORS, REASONS
from stgcnd_client.protocol import ErrorCode, Reason

ORDER = "\n".join(CHECK_ORDER)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_code_has_its_row_and_a_place_in_the_order(code):
    assert code in ERRORS, f"add {code!r}'s meaning and client action to ERRORS (codes.py)"
    assert f"`{code.value}`" in ORDER, f"say where {code!r} is checked in CHECK_ORDER (codes.py)"


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_has_its_row_and_a_place_in_the_order(reason):
    assert reason in REASONS, f"add {reason!r}'s row to REASONS (codes.py)"
    doc = REASONS[reason]
    assert doc.code in (ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN) and doc.when and doc.action
    assert f"`{reason.value}`" in ORDER, f"say where {reason!r} is sent in CHECK_ORDER"


def test_the_tables_name_no_code_or_reason_that_is_not_one():
    assert set(ERRORS) == set(ErrorCode) and set(REASONS) == set(Reason)
    named = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", ORDER))
    words = {"v", "id", "op", "camera", "model", "timeout_ms", "arrays", "dtype", "shape", "ts",
             "infer", "push"}
    assert named - words <= {c.value for c in ErrorCode} | {r.value for r in Reason}
