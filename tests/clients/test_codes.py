"""stgcnd_client.codes, the one table of what each error code and reason means and what a
client does, and the order of the checks: each code and reason declared once by its row, which
protocol.py's `ErrorCode` and `Reason` members follow (generated, `stgcnd docs --write`), so
that the documents made from it (`stgcnd docs`) say every code and reason."""

from __future__ import annotations

import re

import pytest

from stgcnd_client.codes import CHECK_ORDER, ERRORS, REASONS, code, reason
from stgcnd_client.protocol import ErrorCode, Reason

ORDER = "\n".join(CHECK_ORDER)
FIX = "stgcnd docs --write"


def test_the_enums_members_are_the_rows():
    """A member is written from its row (protocol.py's generated regions): one without a row
    was written by hand there, a row without one is not generated yet."""
    for enum, rows, table in ((ErrorCode, ERRORS, "ERRORS"), (Reason, REASONS, "REASONS")):
        members = [m.value for m in enum]
        assert members == list(rows), (
            f"{enum.__name__}'s members {members} are not codes.py's {table} rows "
            f"{list(rows)}: declare a {enum.__name__.lower()} by its row in {table} "
            f"(clients/stgcnd_client/codes.py), never in protocol.py, then run `{FIX}`")


@pytest.mark.parametrize("value", list(ERRORS))
def test_every_code_has_its_meaning_action_and_a_place_in_the_order(value):
    doc = ERRORS[value]
    assert doc.meaning and doc.action, f"say what {value!r} means and what a client does"
    assert code(value) in ORDER, f"say where {value!r} is checked in CHECK_ORDER (codes.py)"


@pytest.mark.parametrize("value", list(REASONS))
def test_every_reason_row_is_complete(value):
    doc = REASONS[value]
    assert doc.code in ("busy", "shutting-down"), f"{value!r}: a reason of busy/shutting-down"
    assert doc.when and doc.action and doc.checked, \
        f"{value!r}: say when it is sent, what to do, and what its check looks at (`checked`)"
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", value), f"{value!r}: lower-case words joined by -"
    if doc.code == "busy":
        assert doc.limits, (
            f"{value!r} is a busy reason, a limit a client runs into: give its row `limits=` "
            "(codes.Limit: what is limited, its configuration key, the cost) for "
            f"docs/hardening.md's limits table, then run `{FIX}`")


def test_the_order_names_no_code_or_reason_that_is_not_one():
    named = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", ORDER))
    words = {"v", "id", "op", "camera", "model", "timeout_ms", "arrays", "dtype", "shape", "ts",
             "infer", "push"}
    assert named - words <= set(ERRORS) | set(REASONS)
    with pytest.raises(KeyError):
        reason("no-such-reason")  # so an order naming one fails to import
