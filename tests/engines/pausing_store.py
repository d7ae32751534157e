"""An EngineStore that holds each written artefact before committing it, so that tests can
kill or cancel a build half-way. The pause (seconds) is read from $PAUSE_BUILD_S in the
process that builds, which may be a spawned build child: the environment reaches it, and the
child imports this module to make its PausingStore, which puts the pause in. With
$PAUSE_BUILD_UNTIL (a path) the pause also ends as soon as that file exists."""

from __future__ import annotations

import os
import time
from typing import Any

from stgcnd.engines import build
from stgcnd.engines.store import EngineStore
from stgcnd.log import get_logger

PAUSE_VAR = "PAUSE_BUILD_S"
RELEASE_VAR = "PAUSE_BUILD_UNTIL"
log = get_logger(__name__)


class PausingStore(EngineStore):
    """A store whose builds pause (build.make_manifest, patched below)."""


_make_manifest = build.make_manifest


def _pausing_manifest(*args: Any, **kwargs: Any) -> dict[str, Any]:
    # make_manifest runs after the temp artefact is written and before it is validated and
    # renamed into place: the window a crash or a cancel must leave clean.
    pause = float(os.environ.get(PAUSE_VAR) or 0)
    if pause:
        log.warning("build_test_pause", seconds=pause)
        release = os.environ.get(RELEASE_VAR)
        deadline = time.monotonic() + pause
        while not (release and os.path.exists(release)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.02) if release else left)
    return _make_manifest(*args, **kwargs)


build.make_manifest = _pausing_manifest
