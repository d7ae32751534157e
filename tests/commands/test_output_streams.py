"""A one-shot command's stdout holds its output only: its log goes to stderr, so that
`stgcnd bench > table.txt` or a pipe gets the table without JSON lines in it."""

from __future__ import annotations

import json

import pytest


def test_a_piped_commands_stdout_holds_no_log_lines(tmp_path, stgcnd_main):
    pytest.importorskip("onnxruntime")
    # The streams, not the model, are under test: a short window keeps the export cheap.
    proc = stgcnd_main("build", "--backend", "onnxruntime", "--no-validate", "--frames", "8",
                       "--engines", str(tmp_path / "engines"))  # captured: not a terminal
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("note: demo model"), proc.stdout
    assert "built onnxruntime fp32" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("{")]
    # ...and the log did happen, as JSON lines (stderr is not a terminal either).
    events = [json.loads(line)["event"] for line in proc.stderr.splitlines()
              if line.startswith("{")]
    assert "onnx_export_needed" in events, proc.stderr
