"""The documentation's generated parts (`stgcnd docs`, server/generated_docs.py): current in
the checkout, written by one command, and only inside their marked regions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd.server.doc_regions import END, regions, replace, start_marker
from stgcnd.server.generated_docs import FIX, PARTS, hardening_limits, reasons, stale
from stgcnd_client.codes import REASONS, reason, reasons_of
from stgcnd_client.protocol import ErrorCode, Reason
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
    assert {r for c in (ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN) for r in reasons_of(c)} \
        == set(Reason) == set(REASONS)


def test_every_busy_reason_is_a_limit_of_the_hardening_table():
    """A `busy` reason is a limit a client runs into: docs/hardening.md's table of them names
    each (#44: a new reason reached protocol.md's tables, generated from codes.py, but not
    this one, whose rows are written one by one in generated_docs.hardening_limits)."""
    limits = hardening_limits()
    missing = [r.value for r in reasons_of(ErrorCode.BUSY) if reason(r) not in limits]
    assert not missing, (
        f"busy reasons {missing} are in no row of docs/hardening.md's limits table: add the "
        "limit that says each (its key, default, what the client sees, its cost) to "
        f"hardening_limits() in daemon/stgcnd/server/generated_docs.py, then run `{FIX}`")
