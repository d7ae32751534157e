"""Loaded by every interpreter started with this folder first on PYTHONPATH: the daemon of
tests/server/test_upgrade.py and its spawned build child. It makes int8 builds (the ones a
background upgrade runs) hold or fail, as a slow or broken build would, and leaves every other
build alone.

$HOLD_INT8_UNTIL (a path): an int8 build waits, after writing its artefact and before
validating and committing it, until that file exists (at most 300 s).
$FAIL_INT8_BUILD=1: an int8 build raises there instead.
$HOLD_MADE_UNTIL (a path): an upgrade whose runners are made and warmed writes PATH.made and
waits until PATH exists (at most 300 s) before it is handed to the loop to swap in (a shutdown
or reload meets it made, not swapped).
$GROW_MAKING_MB (an integer): an int8 upgrade's runners, made in the daemon, take that many MB
more of its heap (touched, kept) and take $GROW_MAKING_S (3) seconds longer: torch compiling
ten tuned buckets in the daemon grew it by 2.1 GB in about 55 s on an H100.
$UPGRADE_NORMAL_PRIORITY=1: the background build runs at normal priority: on a CPU shared
with other work (this test machine) an idle-priority build may get no CPU at all
(tests/server/test_upgrade.py tests the priority on its own)."""

from __future__ import annotations

import os
import time

if os.environ.get("HOLD_INT8_UNTIL") or os.environ.get("FAIL_INT8_BUILD"):
    from stgcnd.engines import build

    _make_manifest = build.make_manifest

    def _held(*args, **kwargs):  # make_manifest(model, builder, options, ...)
        if args[2].precision == "int8":
            if os.environ.get("FAIL_INT8_BUILD"):
                raise RuntimeError("int8 build failed on purpose (test)")
            release, deadline = os.environ["HOLD_INT8_UNTIL"], time.monotonic() + 300
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)
        return _make_manifest(*args, **kwargs)

    build.make_manifest = _held

if os.environ.get("HOLD_MADE_UNTIL"):
    from stgcnd.server import models

    _load_upgrade = models.load_upgrade

    def _made_then_held(*args, **kwargs):  # server.py imports it from models after this
        fresh = _load_upgrade(*args, **kwargs)
        release, deadline = os.environ["HOLD_MADE_UNTIL"], time.monotonic() + 300
        with open(release + ".made", "w"):
            pass
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return fresh

    models.load_upgrade = _made_then_held

if os.environ.get("GROW_MAKING_MB"):
    import numpy as np

    from stgcnd.server import models

    _place_and_start = models._place_and_start
    _kept = []

    def _grown(*args, **kwargs):  # _place_and_start(model_config, choice, ...)
        if args[1].options.precision == "int8":
            _kept.append(np.ones(int(os.environ["GROW_MAKING_MB"]) << 17))  # 8-byte floats
            time.sleep(float(os.environ.get("GROW_MAKING_S", "3")))
        return _place_and_start(*args, **kwargs)

    models._place_and_start = _grown

if os.environ.get("UPGRADE_NORMAL_PRIORITY"):
    from stgcnd.server import serve_now

    serve_now._lower_this_thread = lambda: None
