"""Feed health: per camera, whether what it sends can be used at all, said once per change
(a `feed` event and a `feed_health` log line) instead of a share buried in each interval's
`skeleton_quality` line. It reads those records (telemetry/skeleton_quality.py), once per
stats interval, off the request path; times come from the caller, so scripted records test
it exactly. The same state machine, in the same pass, decides the log's skeleton quality
lines (`skeleton_quality_low`/`_recovered`): without it they flapped with a camera hovering
at `quality_floor` while the feed, under hysteresis, said nothing.
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
class Verdict:
    """A judged state that changes once it has not held for `intervals` in a row, to what
    holds in the last of them."""

    state: str = OK
    off: int = 0        # intervals in a row the state did not hold

    def settle(self, holds: str, intervals: int) -> bool:
        """One interval's judgement; True when the state changed."""
        if holds == self.state:
            self.off = 0
            return False
        self.off += 1
        if self.off < intervals:
            return False
        self.state, self.off = holds, 0
        return True


@dataclass
class Feed:
    health: Verdict
    quality: Verdict    # LOW while the usable share is under quality_floor
    since: float = 0.0  # Unix time the state was said (the camera's first record for ok)


LOW = "low"


# The hysteresis, as action events have: a bad state holds while its share is at least
# feed_exit, another holds when its share reaches feed_enter. The state changes once it has
# not held for feed_intervals intervals in a row, to what holds in the last of them (ok when
# none does: a recovery); a camera flickering between two bad states is still said bad.
# The quality lines go by the same rule on the unusable share (1 - usable): low when usable
# falls below quality_floor, held until the unusable share falls below its entry share x
# feed_exit / feed_enter (usable 0.8 with the defaults), feed_intervals intervals in a row.
class FeedHealth:
    def __init__(self) -> None:
        self._feeds: dict[str, Feed] = {}
        # The last update's skeleton quality lines: the record with `event` (the log's name)
        self.notes: list[Record] = []

    def update(self, records: list[Record], wall: float, config: ServerConfig) -> list[Event]:
        """The changes one interval's records make. A camera without a record (gone from the
        camera table, and sending nothing) is forgotten."""
        enter, exit_ = config.feed_enter, min(config.feed_exit, config.feed_enter)
        feeds: dict[str, Feed] = {}
        changes: list[Event] = []
        self.notes = []
        for record in records:
            camera = str(record["camera"])
            feed = feeds[camera] = self._feeds.get(camera) or Feed(Verdict(), Verdict(),
                                                                    since=wall)
            self._judge_quality(feed.quality, record, config)
            share = shares(record)
            previous = feed.health.state
            holds = next((s for s in STATES if (share[s] or 0.0) >=
                          (exit_ if s == previous else enter)), OK)
            if not feed.health.settle(holds, config.feed_intervals):
                continue
            changes.append({"kind": "feed", "camera": camera, "state": holds,
                            "previous": previous, "at": round(wall, 3),
                            "previous_since": round(feed.since, 3),
                            **{k: record[k] for k in FIGURES},
                            "share": None if holds == OK else _round(share[holds])})
            feed.since = wall
        self._feeds = feeds
        return changes

    def _judge_quality(self, quality: Verdict, record: Record, config: ServerConfig) -> None:
        usable = record.get("usable")
        if not isinstance(usable, float):
            return  # no frame in the interval: nothing to judge the skeletons by
        enter = 1.0 - config.quality_floor  # the unusable share that makes a camera low
        held = enter * min(config.feed_exit, config.feed_enter) / config.feed_enter
        unusable = 1.0 - usable
        low = unusable > enter if quality.state == OK else unusable >= held
        if quality.settle(LOW if low else OK, config.feed_intervals):
            self.notes.append({**record, "event": "skeleton_quality_low",
                               "floor": config.quality_floor} if low else
                              {**record, "event": "skeleton_quality_recovered"})

    def states(self) -> dict[str, dict[str, object]]:
        """Each camera's state now, for `stats`."""
        return {camera: {"state": f.health.state, "since": round(f.since, 3)}
                for camera, f in sorted(self._feeds.items())}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
