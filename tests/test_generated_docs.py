"""The documentation's generated parts (`stgcnd docs`, stgcnd_tools/docs/generated.py): current in
the checkout, written by one command, and only inside their marked regions; and a new error
code or reason declared by its one row of stgcnd_client/codes.py (#44)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd.server.admission import CHECKS
from stgcnd_client import codes
from stgcnd_client.codes import ERRORS, REASONS, Limit, ReasonDoc, checked, reason, reasons_of
from stgcnd_client.protocol import ErrorCode
from stgcnd_tools.docs import generated as generated_docs
from stgcnd_tools.docs.generated import (
    FIX,
    PARTS,
    check_order,
    hardening_limits,
    reason_members,
    reasons,
    stale,
)
from stgcnd_tools.docs.regions import END, regions, replace, start_marker
from tests.conftest import REPO

FILES = sorted({part.path for part in PARTS})


def test_every_generated_part_is_current():
    assert not stale(REPO), f"generated parts are stale in {stale(REPO)}: run `{FIX}`"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files that hold generated parts, copied where a test may break them."""
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    return tmp_path


def test_one_command_writes_every_part_and_keeps_the_text_around_them(checkout, stgcnd_main):
    """A stale part in each file (the README's key table and the example included), then
    `stgcnd docs` says which and how to fix them, and `--write` makes them what the code
    says, the hand-written text around every region as it was."""
    for part in PARTS:
        path = checkout / part.path
        if part.whole_file:
            path.write_text("# pasted by hand, once\n")
        else:
            path.write_text(replace(path.read_text(), part.name, part.source, "| stale |",
                                    part.path))
    (checkout / "docs" / "protocol.md").write_text(
        (checkout / "docs" / "protocol.md").read_text().replace(
            "## 7. Versioning\n", "## 7. Versioning\n\nA hand-written line.\n"))
    checked = stgcnd_main("docs", "--root", str(checkout))
    assert checked.returncode == 1
    assert all(name in checked.stderr for name in FILES) and FIX in checked.stderr

    assert stgcnd_main("docs", "--root", str(checkout), "--write").returncode == 0
    for name in FILES:
        written = (checkout / name).read_text()
        if name == "docs/protocol.md":
            assert "A hand-written line." in written
            written = written.replace("\nA hand-written line.\n", "")
        assert written == (REPO / name).read_text(), name
    assert stgcnd_main("docs", "--root", str(checkout)).returncode == 0


def test_a_part_without_its_region_names_the_lines_to_add(checkout, stgcnd_main):
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("<!-- generated: config-keys", "<!-- keys"))
    result = stgcnd_main("docs", "--root", str(checkout))
    assert result.returncode == 2
    assert start_marker("config-keys", "daemon/stgcnd/server/config.py") in result.stderr
    assert END in result.stderr


@pytest.mark.parametrize(("text", "problem"), [
    ("<!-- generated: a -->\nx\n", "has no"),
    ("<!-- generated: a -->\n<!-- generated: b -->\n" + END + "\n", "not closed before 'b'"),
    (("<!-- generated: a -->\n" + END + "\n") * 2, "marked twice"),
])
def test_broken_markers_are_refused(text, problem):
    with pytest.raises(UserError, match=problem):
        regions(text, "x.md")


def test_an_indented_region_stays_inside_its_list_item():
    text = "- item:\n\n  <!-- generated: t -->\n  old\n  " + END + "\n- next\n"
    assert replace(text, "t", "src", "| a |\n|---|\n", "x.md") == (
        "- item:\n\n  " + start_marker("t", "src") + "\n\n  | a |\n  |---|\n\n  " + END
        + "\n- next\n")


@pytest.mark.parametrize("code", [ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN])
def test_each_reason_is_a_row_of_its_codes_table(code):
    """The tables list the reasons from the code's table, each once, whatever their number."""
    rows = reasons(code).splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| `{r.value}`" for r in reasons_of(code)]
    assert [r.value for c in ("busy", "shutting-down") for r in reasons_of(c)] \
        == sorted(REASONS, key=list(REASONS).index)


def test_every_busy_reason_is_a_limit_of_the_hardening_table():
    """A `busy` reason is a limit a client runs into: docs/hardening.md's table of them has a
    row made from each one's `limits` in codes.py (#44: a new reason reached protocol.md's
    tables but not this one, whose rows were written one by one)."""
    limits = hardening_limits()
    assert not [r.value for r in reasons_of("busy") if reason(r.value) not in limits]


def test_the_order_names_every_code_and_reason_and_each_reason_once():
    order = check_order()
    assert not [c for c in ERRORS if f"`{c}`" not in order], "name it in codes.CHECK_ORDER"
    twice_or_never = [r for r in REASONS if order.count(f"`{r}`") != 1]
    assert not twice_or_never, (
        f"{twice_or_never}: name each reason once in the order of the checks: an admission "
        "check by its entry in server/admission.py's CHECKS, any other by checked() in "
        "codes.CHECK_ORDER")


def test_the_order_lists_the_admission_checks_as_admit_runs_them():
    """Between the camera slot and `ts`, in CHECKS' order: each check is a busy reason's row,
    said as its `checked` says."""
    order = " ".join(check_order().split())
    said = [checked("no-camera-slot")] + [checked(r) for r, _ in CHECKS] + ["`ts` against"]
    at = [order.find(s) for s in said]
    assert -1 not in at and at == sorted(at), (said, at)
    assert all(REASONS[r].code == "busy" for r, _ in CHECKS)


def test_one_row_declares_a_reason_everywhere(monkeypatch):
    """A new busy reason is its row in codes.py (and, checked at admission, its entry in
    CHECKS): its Reason member, its row of the busy table, its place in the order of the
    checks and its limit in docs/hardening.md (the key's default from the schema) follow."""
    row = ReasonDoc("too-early", "busy", "a frame came before its time", "wait for it",
                    "the camera's frame time", appended=False,
                    limits=(Limit("a camera's frames per model", "[[models]] frames",
                                  "{default} frames", notes="counted per camera"),))
    monkeypatch.setitem(codes.REASONS, row.value, row)  # codes.py's table, read by both
    monkeypatch.setattr(generated_docs, "CHECKS", (*CHECKS, (row.value, lambda *_: None)))
    assert 'TOO_EARLY = "too-early"  # busy' in reason_members()
    assert "| `too-early` | a frame came before its time | not kept (`false`) | wait for it |" \
        in reasons(ErrorCode.BUSY)
    order = " ".join(check_order().split())
    assert "the camera's frame time (`busy` `too-early`), then `ts` against" in order
    assert "| a camera's frames per model (`[[models]] frames`) | 150 frames | `busy` " \
        "`too-early` (what it means" in hardening_limits()
