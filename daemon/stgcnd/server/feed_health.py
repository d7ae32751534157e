"""Feed health: per camera, whether what it sends can be used at all, said once per change
(a `feed` event and a `feed_health` log line) instead of a share buried in each interval's
`skeleton_quality` line. It reads those records (telemetry/skeleton_quality.py), once per
stats interval, off the request path; times come from the caller, so scripted records test
it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from stgcnd.server.config import ServerConfig
from stgcnd.telemetry.skeleton_quality import Record

Event = Dict[str, object]
OK = "ok"
# The bad states, the first that holds winning: a camera that sends nothing cannot be judged
# on its skeletons, nor one whose requests are all refused.
STATES = ("silent", "refused", "blocked", "no-person", "low-visibility", "out-of-frame")
FIGURES = ("sent", "frames", "refused_input", "refused_busy", "no_person", "visibility",
           "low_visibility", "out_of_frame")  # the record's, sent with each change


def shares(record: Record) -> dict[str, float | None]:
    """Each bad state's share in one interval's record (None: nothing to judge it by)."""
    sent = int(record["sent"] or 0)

    def of_sent(key: str) -> float | None:
        return int(record[key] or 0) / sent if sent else None

    def share(key: str) -> float | None:
        value = record[key]
        return None if value is None else float(value)

    return {"silent": 0.0 if sent else 1.0, "refused": of_sent("refused_input"),
            "blocked": of_sent("refused_busy"), "no-person": share("no_person"),
            "low-visibility": share("low_visibility"), "out-of-frame": share("out_of_frame")}


@dataclass(frozen=True)
class Gate:
    """What makes an action event's window usable (server/events.py), by this module's own
    measures ([server] keys), so that a feed said low-visibility or out-of-frame starts no
    event: one threshold for both."""

    visibility: float = 0.5     # visibility_threshold: a joint below it is lost
    out_of_frame: float = 0.5   # feed_enter: the share of visible joints outside 0..1


@dataclass
class Feed:
    state: str = OK
    since: float = 0.0  # Unix time the state was said (the camera's first record for ok)
    off: int = 0        # intervals in a row the state did not hold


# The hysteresis, as action events have: a bad state holds while its share is at least
# feed_exit, another holds when its share reaches feed_enter. The state changes once it has
# not held for feed_intervals intervals in a row, to what holds in the last of them (ok when
# none does: a recovery); a camera flickering between two bad states is still said bad.
class FeedHealth:
    def __init__(self) -> None:
        self._feeds: dict[str, Feed] = {}

    def update(self, records: list[Record], wall: float, config: ServerConfig) -> list[Event]:
        """The changes one interval's records make. A camera without a record (gone from the
        camera table, and sending nothing) is forgotten."""
        enter, exit_ = config.feed_enter, min(config.feed_exit, config.feed_enter)
        feeds: dict[str, Feed] = {}
        changes: list[Event] = []
        for record in records:
            camera = str(record["camera"])
            feed = feeds[camera] = self._feeds.get(camera) or Feed(since=wall)
            share = shares(record)
            holds = next((s for s in STATES if (share[s] or 0.0) >=
                          (exit_ if s == feed.state else enter)), OK)
            if holds == feed.state:
                feed.off = 0
                continue
            feed.off += 1
            if feed.off < config.feed_intervals:
                continue
            changes.append({"kind": "feed", "camera": camera, "state": holds,
                            "previous": feed.state, "at": round(wall, 3),
                            "previous_since": round(feed.since, 3),
                            **{k: record[k] for k in FIGURES},
                            "share": None if holds == OK else _round(share[holds])})
            feed.state, feed.since, feed.off = holds, wall, 0
        self._feeds = feeds
        return changes

    def states(self) -> dict[str, dict[str, object]]:
        """Each camera's state now, for `stats`."""
        return {camera: {"state": f.state, "since": round(f.since, 3)}
                for camera, f in sorted(self._feeds.items())}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
