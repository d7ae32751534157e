"""The events open on the subscriber socket, kept on disk, so that a daemon killed during an
event (SIGKILL, a power cut) can say at its next start which events ended: the `end` its
subscribers never got (reason `daemon-restart`; docs/protocol.md §11, "After a crash").

The file is written whole and replaced by a rename at each start and end and every stats
interval while one is open (its `alive` dates the crash to within that interval), and removed
when none is open: a reader sees an old file or a new one, never a part. The rename is done on
the I/O loop (a process killed right after finds the file: the page cache outlives it); the
fsyncs that carry it through a power cut run on a thread of their own, since one costs the
loop ~10 ms on this VM's disk and more on a Jetson's eMMC. A power cut before they land can
leave a file that cannot be parsed: it is said once in the log and taken as none, like any
unreadable file (no end is invented).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Dict

from stgcnd.fsutil import fsync_path, new_temp_file
from stgcnd.log import get_logger

log = get_logger("stgcnd.server.events")

RESTART_REASON = "daemon-restart"  # the reason MQTT's ends of a crashed run give too
FORMAT = 1

Event = Dict[str, object]


def default_path(events_endpoint: str) -> Path:
    """systemd's StateDirectory/open-events.json (one daemon per unit), else one file per
    events endpoint under $XDG_STATE_HOME/stgcnd (~/.local/state): two daemons of one user
    never share it (no two can bind the same endpoint)."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / "open-events.json"
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    name = hashlib.sha256(events_endpoint.encode()).hexdigest()[:12]
    return base / "stgcnd" / f"open-events-{name}.json"


class OpenEventsFile:
    """The open events' start messages by id, as the last run wrote them (`save`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failed = False  # a write that failed is said once until one succeeds
        self._dirty = threading.Event()  # a rename the fsync thread has not made durable
        self._closed = False
        self._syncer: threading.Thread | None = None

    def ended(self, now: float) -> list[Event]:
        """The `end` of every event the file says was open (a run that stopped cleanly
        left none), dated at its last sign of life; the file is then removed."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("open_events_unreadable", path=str(self.path), error=str(exc),
                        action="a crashed run's open events get no end on the socket; "
                               "check the file's permissions")
            return []
        try:
            saved = json.loads(raw)
            alive = float(saved["alive"])
            opened = [e for e in saved["open"] if isinstance(e, dict) and "id" in e]
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("open_events_unreadable", path=str(self.path), error=repr(exc),
                        action="ignored: a crashed run's open events get no end on the "
                               "socket")
            opened, alive = [], now
        self.save({}, now)
        return [restart_end(start, alive, now) for start in opened]

    def save(self, opened: Mapping[str, Event], now: float) -> None:
        """The open events now (`opened`: id -> start message); none: the file goes."""
        try:
            if opened:
                body = {"format": FORMAT, "alive": round(now, 3), "open": list(opened.values())}
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = new_temp_file(self.path)
                try:
                    tmp.write_bytes(json.dumps(body, default=str).encode())
                    os.replace(tmp, self.path)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            else:
                self.path.unlink(missing_ok=True)
            self._failed = False
            self._sync_later()
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("open_events_unsaved", path=str(self.path), error=str(exc),
                            action="a crash would leave its open events without an end "
                                   "on the socket; make the directory writable")


    def _sync_later(self) -> None:
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_forever, daemon=True,
                                            name="stgcnd-open-events-sync")
            self._syncer.start()
        self._dirty.set()

    def _sync_forever(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._closed:
                return
            fsync_path(self.path)  # gone since (none open): its directory below still counts
            fsync_path(self.path.parent)

    def close(self) -> None:
        """At a clean stop: the last state made durable before the daemon exits."""
        self._closed = True
        if self._syncer is not None:
            self._dirty.set()
            self._syncer.join(timeout=5.0)
        fsync_path(self.path)
        fsync_path(self.path.parent)


def restart_end(start: Mapping[str, object], alive: float, now: float) -> Event:
    """A crashed run's open event's end: its start's keys, `ended` at the run's last sign
    of life (the crash came then or later); `seq` and `run` are this run's (the hub's)."""
    end: Event = {k: v for k, v in start.items() if k not in ("seq", "run", "mqtt_id")}
    started = start.get("started")
    end.update(kind="end", reason=RESTART_REASON, at=round(now, 3), ended=round(alive, 3))
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        end["duration_s"] = round(max(alive - started, 0.0), 3)
    return end

