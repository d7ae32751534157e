"""Action events: per camera, model and class, a small state machine over the predictions,
so that a site gets "started on cam3 at 14:02:11, ended 14:02:19, peak 0.93" instead of one
probability a window. Plain Python on the I/O loop; times come from the caller, so scripted
sequences test it exactly: the daemon's clocks, or a camera's own (its frames' `ts`), so that
a loaded daemon answering late neither makes nor hides an event. The rules alone: what says
and publishes their events is server/event_hub.py's, which loads this only for a watched model.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Dict, Mapping, Sequence

import numpy as np

from stgcnd.server.cameras import CameraState
from stgcnd.server.config import EventsConfig
from stgcnd.server.feed_health import Gate

Event = Dict[str, object]


# The state machine of one (camera, model, class):
#
#     idle --(smoothed >= enter, outside the cooldown)--> pending
#     pending --(smoothed < enter, a window without a person or out of frame, or no
#         prediction for max(exit_hold_s, event_idle_s))--> idle  (a spike is no event)
#     pending --(held for min_duration_s)--> active: "start"
#     active --(smoothed < exit, or no person, for exit_hold_s; or no prediction for
#         event_idle_s)--> idle: "end", then cooldown_s (from the end) before a new start
#
# Smoothing is an EMA of the class's probability, or k-of-n: the k-th highest of the last n
# windows' probabilities (k of the last n windows were at least that). exit < enter is the
# hysteresis that keeps a probability hovering at the threshold from flickering; the exit
# hold keeps a dropout window from ending an event (and its cooldown from hiding the rest).
# A window without a person (usable_share below min_usable) says nothing of the action, nor
# one whose visible joints lie out of frame as the feed's health judges it (feed_health.Gate).
# A pending start whose predictions stopped for longer than the gap has not been seen to
# hold: a window after a minute's silence must not complete a wait begun before it.
@dataclass(frozen=True)
class Rule:
    """What one class of one camera's model needs to start and end an event."""

    enter: float
    exit: float
    min_duration_s: float
    cooldown_s: float
    exit_hold_s: float
    gap_s: float          # no prediction for this long drops a pending start
    smoothing: str        # "ema" or "k-of-n"
    alpha: float
    k: int
    n: int
    update_s: float = 0.0  # an open event's `update` this often (0: none)
    tags: tuple[tuple[str, str], ...] = ()  # the model's tags, the camera's over them


def rules_for(config: EventsConfig, labels: Sequence[str], camera: str
              ) -> dict[int, Rule]:
    """Class index -> its rule for `camera`: the model's thresholds, then the class's, then
    the camera's overrides. Quiet classes (default: the first, e.g. "normal") get none."""
    cam = config.cameras.get(camera)
    if cam is not None and not cam.enabled:
        return {}
    quiet = set(config.quiet_classes if config.quiet_classes is not None else labels[:1])
    out = {}
    for i, label in enumerate(labels):
        if label in quiet:
            continue
        cls = config.classes.get(label)
        enter = _first(cam.enter if cam else None, cls.enter if cls else None, config.enter)
        exit_ = _first(cam.exit if cam else None, cls.exit if cls else None, config.exit)
        out[i] = Rule(
            enter=enter, exit=min(exit_, enter),
            min_duration_s=_first(cam.min_duration_s if cam else None, config.min_duration_s),
            cooldown_s=_first(cam.cooldown_s if cam else None, config.cooldown_s),
            exit_hold_s=config.exit_hold_s,
            gap_s=max(config.exit_hold_s, config.event_idle_s),
            smoothing=config.smoothing, alpha=config.ema_alpha, k=config.k, n=config.n,
            update_s=config.update_interval_s,
            tags=tuple(sorted({**config.tags, **(cam.tags if cam else {})}.items())))
    return out


def _first(*values: float | None) -> float:
    """The most specific setting: the first one given (the model's own is always given)."""
    return float(next(v for v in values if v is not None))


def usable_share(window: np.ndarray, visibility: float) -> float:
    """The share of a window's frames (3, T, V, M: x, y, visibility) with a person whose
    joints' mean visibility is at least `visibility` (an empty slot is all 0)."""
    return usable_and_person(window, visibility)[0]


def usable_and_person(window: np.ndarray, visibility: float) -> tuple[float, int]:
    """`usable_share`, and the window's leading person: the slot (0..M-1) seen, joints' mean
    visibility at least `visibility`, in the most frames; a tie goes to the higher summed
    visibility, then the lower slot. The model pools its M persons into one score a window
    (the mean of their features), so no slot's own score exists: the person an event names
    is the one most present in the window that crossed `enter`. A matmul sums the joints:
    ~30 us for 150 frames, where .mean(axis=1) took 60-400 us (M = 1-5)."""
    vis = window[2]                                            # (T, V, M)
    sums = np.ones(vis.shape[1], vis.dtype) @ vis              # (T, M)
    seen_by = sums >= visibility * vis.shape[1]                # (T, M)
    seen = seen_by.any(axis=1)                                 # (T,)
    share = float(np.count_nonzero(seen)) / max(len(seen), 1)
    if sums.shape[1] == 1:
        return share, 0
    frames = seen_by.sum(axis=0)                               # (M,)
    most = frames == frames.max()
    return share, int(np.argmax(np.where(most, sums.sum(axis=0), -np.inf)))


def out_of_frame_share(window: np.ndarray, visibility: float) -> float:
    """The share of a window's visible joints (a present person's, at least `visibility`)
    with x or y outside 0..1: the feed's out_of_frame (telemetry/skeleton_quality.py) over
    the window's frames; 0.0 where none is visible."""
    vis = window[2]
    seen = (vis >= visibility) & (vis > 0)
    n = int(np.count_nonzero(seen))
    if not n:
        return 0.0
    x, y = window[0][seen], window[1][seen]
    return float(np.count_nonzero((x < 0) | (x > 1) | (y < 0) | (y > 1))) / n


@dataclass
class Track:
    """One class of one camera's model: its smoothed probability and where it stands."""

    rule: Rule
    state: str = "idle"                 # idle, pending, active
    smoothed: float | None = None
    recent: collections.deque[float] = field(default_factory=collections.deque)
    since: float = 0.0                  # monotonic: pending since, or active since
    started_wall: float = 0.0
    last_wall: float = 0.0              # the camera's latest prediction (an idle camera's end)
    last_now: float = 0.0               # ... its monotonic time
    heard: float = 0.0                  # ... the daemon's monotonic time (a silent camera's)
    timed: bool = False                 # on the camera's clock (ts): `now` and `wall` are it
    below_since: float | None = None    # monotonic: the exit hold's first window
    below_wall: float = 0.0             # ... its wall time: when the event ended, if it does
    peak: float = 0.0
    person: int = 0                     # the leading person of the window that crossed enter
    score: float = 0.0                  # ... and its smoothed probability, which crossed
    next_update: float = 0.0            # monotonic: an open event's next `update`
    cooldown_until: float = float("-inf")

    def smooth(self, p: float) -> float:
        rule = self.rule
        if rule.smoothing == "ema":
            self.smoothed = p if self.smoothed is None else (
                rule.alpha * p + (1.0 - rule.alpha) * self.smoothed)
            return self.smoothed
        self.recent.append(p)
        while len(self.recent) > rule.n:
            self.recent.popleft()
        self.smoothed = (sorted(self.recent, reverse=True)[rule.k - 1]
                         if len(self.recent) >= rule.k else 0.0)
        return self.smoothed

    def retarget(self, rule: Rule) -> None:
        """A reload's rule. Switched to k-of-n, the window starts full of the last smoothed
        value, so that an open event is judged by the new rule, not ended by an empty one."""
        if rule.smoothing == "k-of-n" and self.rule.smoothing != "k-of-n":
            self.recent = collections.deque([self.smoothed or 0.0] * rule.n)
        self.rule = rule


class Events:
    """Every (camera, model)'s tracks; `observe` returns the events a prediction caused."""

    def __init__(self) -> None:
        self.configs: dict[str, tuple[EventsConfig, tuple[str, ...]]] = {}
        self.gate = Gate()
        self._tracks: dict[tuple[str, str], dict[int, Track]] = {}

    def configure(self, models: dict[str, tuple[EventsConfig, tuple[str, ...]]],
                  now: float, wall: float, gate: Gate | None = None) -> list[Event]:
        """New rules (start, reload). Open events stay open under the new rules; those of a
        model no longer watched (or a class that became quiet) end, with that reason; a class
        that became watched is tracked from now on. `gate`: the server's (default: Gate())."""
        self.gate = gate if gate is not None else Gate()
        ended: list[Event] = []
        for (camera, model), tracks in list(self._tracks.items()):
            if model not in models:  # ended with the old labels, then forgotten
                ended += self._end_all(camera, model, tracks, now, wall, "model-removed")
                del self._tracks[(camera, model)]
                continue
            config, labels = models[model]
            rules = rules_for(config, labels, camera)
            for i in list(tracks):
                if i not in rules:
                    ended += self._end_all(camera, model, {i: tracks.pop(i)}, now, wall,
                                           "reconfigured")
                else:
                    tracks[i].retarget(rules[i])
            for i in rules.keys() - tracks.keys():
                tracks[i] = Track(rules[i])
        self.configs = dict(models)
        return ended

    def classes(self, camera: str, model: str) -> list[str]:
        """The labels of the classes `camera` has rules for under `model` (none: unwatched)."""
        if model not in self.configs:
            return []
        config, labels = self.configs[model]
        return [labels[i] for i in rules_for(config, labels, camera)]

    def observe(self, camera: str, model: str, probs: Sequence[float], now: float,
                wall: float, usable: float = 1.0, heard: float | None = None,
                framed: bool = True, lead: int = 0) -> list[Event]:
        """`usable`: the window's usable_share (1.0: a person in every frame); `lead`: its
        leading person (usable_and_person), named by an event it starts. `heard`: the
        daemon's monotonic time when `now` and `wall` are the camera's clock (its `ts`).
        `framed`: False for a window out of frame (Gate), which counts as one without a
        person, with its own reason. `now` alone decides; the times reported derive from
        `wall` and `now`'s differences, so that `at - started` is the wait held."""
        key = (camera, model)
        tracks = self._tracks.get(key)
        if tracks is None:
            if model not in self.configs:
                return []
            config, labels = self.configs[model]
            tracks = self._tracks[key] = {
                i: Track(rule) for i, rule in rules_for(config, labels, camera).items()}
        out: list[Event] = []
        config, labels = self.configs[model]
        person = usable >= config.min_usable and framed
        for i, track in tracks.items():
            if i >= len(probs):
                continue
            if track.state == "pending" and now - track.last_now > track.rule.gap_s:
                track.state = "idle"   # unseen through the gap: the wait begins again
            track.last_wall, track.last_now = wall, now
            track.heard, track.timed = (now, False) if heard is None else (heard, True)
            if not person:  # no smoothing, no start (a pending one waits anew), the hold runs
                if track.state == "active":
                    out += self._hold(camera, model, labels, i, track, now, wall,
                                      "no-person" if framed else "out-of-frame")
                    out += self._update(camera, model, labels, i, track, now, wall)
                track.state = "idle" if track.state == "pending" else track.state
                continue
            p = float(probs[i])
            s = track.smooth(p)
            rule = track.rule
            if track.state == "idle":
                if s >= rule.enter and now >= track.cooldown_until:
                    track.state, track.since, track.started_wall = "pending", now, wall
                    track.peak, track.person, track.score = p, lead, s
            elif track.state == "pending":
                track.peak = max(track.peak, p)
                if s < rule.enter:
                    track.state = "idle"
            else:
                track.peak = max(track.peak, p)
            if track.state == "pending" and now - track.since >= rule.min_duration_s:
                # Dated by the clock that decided: the wall clock read apart from `now` (a
                # loaded loop's `now` is older) would report a wait shorter than it held.
                track.state, track.started_wall = "active", wall - (now - track.since)
                track.next_update = now + rule.update_s
                out.append(self._event("start", camera, model, labels, i, track, wall))
                continue
            elif track.state == "active" and s < rule.exit:
                out += self._hold(camera, model, labels, i, track, now, wall, "below-exit")
            elif track.state == "active":
                track.below_since = None   # back above exit: the dropout is forgiven
            out += self._update(camera, model, labels, i, track, now, wall)
        return out

    def _update(self, camera: str, model: str, labels: Sequence[str], i: int, track: Track,
                now: float, wall: float) -> list[Event]:
        """An open event's `update` when update_interval_s has passed since its start or its
        last update (on the clock that decides): the smoothed probability now, the peak so
        far and how long it has lasted."""
        if track.state != "active" or not track.rule.update_s or now < track.next_update:
            return []
        track.next_update = now + track.rule.update_s
        event = self._event("update", camera, model, labels, i, track, wall)
        event["duration_s"] = (_ms(wall) - _ms(track.started_wall)) / 1e3
        return [event]

    def observe_window(self, camera: str, model: str, probs: Sequence[float], now: float,
                       wall: float, window: np.ndarray, ts: float | None = None
                       ) -> list[Event]:
        """A prediction of `window` (3, T, V, M); its usable share is computed only here,
        for a watched model. `ts`: the client's time of the window (its last frame), which
        is then the events' clock (docs/protocol.md, `ts`)."""
        watched = self.configs.get(model)
        if watched is None:
            return []
        gate = self.gate
        usable, lead = usable_and_person(window, gate.visibility)
        framed = usable < watched[0].min_usable or \
            out_of_frame_share(window, gate.visibility) < gate.out_of_frame
        return self.observe(camera, model, probs, now, wall, usable, framed=framed,
                            lead=lead) if ts is None else \
            self.observe(camera, model, probs, ts, ts, usable, heard=now, framed=framed,
                         lead=lead)

    def _hold(self, camera: str, model: str, labels: Sequence[str], i: int, track: Track,
              now: float, wall: float, reason: str) -> list[Event]:
        """An event's window below exit (or without a person): the end once such windows have
        lasted exit_hold_s, dated at the first (the activity last seen); the last's reason."""
        if track.below_since is None:
            track.below_since, track.below_wall = now, wall
        if now - track.below_since < track.rule.exit_hold_s:
            return []
        return [self._end(camera, model, labels, i, track, now, wall, reason,
                          track.below_wall)]

    def expire_silent(self, now: float, wall: float, cameras: Mapping[str, CameraState]
                      ) -> list[Event]:
        """Open events of a camera with neither a prediction nor a request (`cameras`: the
        camera table) for its model's event_idle_s end (camera-silent), dated at its last
        prediction: a dead camera's event does not stay open for idle_timeout, nor count the
        silence in its duration; a live camera whose predictions lag (an overloaded daemon,
        a long stride) keeps its events."""
        ended: list[Event] = []
        for (camera, model), tracks in self._tracks.items():  # a removed model's are gone
            cam = cameras.get(camera)
            heard = now - (cam.last_activity if cam is not None else float("-inf"))
            idle_s = self.configs[model][0].event_idle_s
            silent = {i: t for i, t in tracks.items()
                      if min(now - t.heard, heard) >= idle_s}
            ended += self._end_all(camera, model, silent, now, wall, "camera-silent",
                                   at_last_prediction=True)
        return ended

    def forget(self, camera: str, now: float, wall: float, reason: str) -> list[Event]:
        """A camera gone (idle, evicted): its open events end, dated by its last prediction
        (the last that saw them), not by when the daemon noticed it was gone: minutes later
        for an idle camera, which would lengthen the event by as much."""
        # Every track goes before any end is made: after a daemon fault (reason internal,
        # requests.py) the camera starts over even if its ends cannot be said.
        gone = [(key[1], self._tracks.pop(key)) for key in
                [k for k in self._tracks if k[0] == camera]]
        ended: list[Event] = []
        for model, tracks in gone:
            ended += self._end_all(camera, model, tracks, now, wall, reason,
                                   at_last_prediction=True)
        return ended

    def close_all(self, now: float, wall: float, reason: str) -> list[Event]:
        ended: list[Event] = []
        for (camera, model), tracks in self._tracks.items():
            ended += self._end_all(camera, model, tracks, now, wall, reason)
        return ended

    def open_events(self) -> int:
        return sum(t.state == "active" for ts in self._tracks.values() for t in ts.values())

    def snapshot(self, wall: float) -> list[Event]:
        """Every open event as it stands now (kind "snapshot"): what a late subscriber missed."""
        return [self._event("snapshot", cam, model, self.configs[model][1], i, t, wall)
                for (cam, model), ts in self._tracks.items() for i, t in ts.items()
                if t.state == "active"]  # a model unwatched is forgotten (configure)

    def _end_all(self, camera: str, model: str, tracks: dict[int, Track], now: float,
                 wall: float, reason: str, at_last_prediction: bool = False) -> list[Event]:
        """Ends the daemon decides (no prediction): on a timed track's clock, its last
        prediction's time plus the daemon's time since (its cooldown, `at`, a shutdown's end)."""
        labels = self.configs[model][1] if model in self.configs else ()
        out = []
        for i, t in tracks.items():
            if t.state == "active":
                since = now - t.heard if t.timed else 0.0
                t_now, t_wall = (t.last_now + since, t.last_wall + since) if t.timed \
                    else (now, wall)
                out.append(self._end(camera, model, labels, i, t, t_now, t_wall, reason,
                                     t.last_wall if at_last_prediction else t_wall))
        return out

    def _end(self, camera: str, model: str, labels: Sequence[str], i: int, track: Track,
             now: float, wall: float, reason: str, ended: float | None = None) -> Event:
        """`ended`: when the event ended (default `wall`: now); `at`: when this was said."""
        event = self._event("end", camera, model, labels, i, track, wall)
        ended_ms, started_ms = _ms(wall if ended is None else ended), _ms(track.started_wall)
        event.update(ended=ended_ms / 1e3, duration_s=(ended_ms - started_ms) / 1e3,
                     reason=reason)
        track.state, track.below_since = "idle", None
        track.cooldown_until = now + track.rule.cooldown_s
        return event

    @staticmethod
    def _event(kind: str, camera: str, model: str, labels: Sequence[str], i: int,
               track: Track, wall: float) -> Event:
        # The one payload of every event message (the log, the socket, MQTT): the id, unique
        # across restarts and forgotten cameras by its start, in milliseconds: the same
        # milliseconds as `started` (ms / 1000), so that either gives the other.
        started_ms = _ms(track.started_wall)
        label = labels[i] if i < len(labels) else str(i)
        return {"kind": kind, "id": f"{camera}/{model}/{i}/{started_ms}",
                "camera": camera,
                "model": model, "class": label, "label": label,
                "class_index": i, "started": started_ms / 1e3,
                "at": round(wall, 3), "probability": round(track.smoothed or 0.0, 4),
                "peak": round(track.peak, 4), "score": round(track.score, 4),
                "person": track.person, "tags": dict(track.rule.tags)}


def _ms(wall: float) -> int:
    """Unix time in whole milliseconds, rounded: how events report times."""
    return round(wall * 1e3)
