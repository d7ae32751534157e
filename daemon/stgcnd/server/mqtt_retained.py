"""What the broker retains of the daemon's earlier runs, made true again (server/mqtt_sink.py;
docs/protocol.md, "Events over MQTT", "Retained topics after a crash").

A run killed (SIGKILL, power) leaves its cameras' retained PREFIX/CAMERA/state saying what was
open then, for ever. At a connection without a session (every start, and a broker that lost
the session) the sink reads those states back and hands them here: every event open in one
that is not open in this run gets an `end` (reason `daemon-restart`) and its camera's state
is cleared; a camera not heard of for `forget_after_s` has its state removed. The plain
topics made from a state (server/mqtt_topics.py: class ON/OFF, feed, discovery) follow it,
with the class topics the broker keeps of the camera (`with_class_topics`): a state written
after the daemon forgot the camera may lack older classes whose topics are still retained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Dict

from stgcnd.server.mqtt_topics import classes_of

RESTART_REASON = "daemon-restart"

State = Dict[str, object]


def run_of(message: object) -> str:
    """The run (RUN of RUN-N) whose sink published `message`; "" where it says none."""
    mqtt_id = message.get("mqtt_id") if isinstance(message, dict) else None
    return mqtt_id.split("-")[0] if isinstance(mqtt_id, str) else ""


def said_at(message: object) -> float | None:
    """A message's `at`, where it has one."""
    at = message.get("at") if isinstance(message, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def heard_of(state: Mapping[str, object]) -> float | None:
    """When the camera of `state` was last heard of: its last message's `at`, or when it was
    announced (`seen`: its first request, before any message), the later."""
    times = [t for t in (said_at(state.get("last")), said_at({"at": state.get("seen")}))
             if t is not None]
    return max(times) if times else None


def with_class_topics(retained: Mapping[str, State], class_topics: Mapping[str, set[str]]
                      ) -> dict[str, State]:
    """`retained` (state topic -> state) with each state's `classes` grown by the classes
    whose topics the broker keeps under the camera (`class_topics`: state topic -> names)."""
    out = dict(retained)
    for topic, names in class_topics.items():
        state = out.get(topic)
        if state is not None and not names <= set(classes_of(state)):
            out[topic] = {**state, "classes": sorted({*classes_of(state), *names})}
    return out


def last_heard(states: Mapping[str, State]) -> dict[str, float]:
    """Run -> the latest `at` of any of its messages the states keep: when that run was last
    known alive, the best date the broker gives of a crash (its last message, so the crash
    came at that time or after)."""
    out: dict[str, float] = {}
    for state in states.values():
        messages = [state.get("last")]
        opened = state.get("open")
        if isinstance(opened, list):
            messages.extend(opened)
        for message in messages:
            run, at = run_of(message), said_at(message)
            if run and at is not None:
                out[run] = max(out.get(run, at), at)
    return out


def reconcile(retained: Mapping[str, State], open_now: Mapping[str, set[str]],
              current: set[str], now: float, forget_after_s: float,
              ) -> tuple[list[tuple[str, State]], dict[str, State | None]]:
    """`retained`: state topic -> the state the broker kept; `open_now`: state topic -> the
    ids of the events open in this run; `current`: the state topics this run has published
    (it republishes those itself). Returns the `end` messages to publish (event topic,
    message without mqtt_id) and the states to retain anew (None: remove the topic)."""
    heard = last_heard(retained)
    ends: list[tuple[str, State]] = []
    states: dict[str, State | None] = {}
    for topic, state in retained.items():
        opened = state.get("open")
        if not topic.endswith("/state") or not isinstance(opened, list):
            continue  # not a state this daemon writes: left alone
        mine = open_now.get(topic, set())
        stale = [e for e in opened if isinstance(e, dict) and str(e.get("id")) not in mine]
        event_topic = topic[:-len("state")] + "event"
        last: object = state.get("last")
        for start in stale:
            ended = heard.get(run_of(start), said_at(start) or now)
            started = start.get("started")
            end: State = {k: v for k, v in start.items() if k not in ("mqtt_id", "seq")}
            end.update(kind="end", reason=RESTART_REASON, at=round(now, 3),
                       ended=round(ended, 3))
            if isinstance(started, (int, float)):
                end["duration_s"] = round(max(ended - started, 0.0), 3)
            ends.append((event_topic, end))
            last = end
        if topic in current:
            continue  # this run's state of the camera goes again anyway
        heard_at = heard_of(state)
        if forget_after_s and heard_at is not None and now - heard_at > forget_after_s:
            states[topic] = None
        elif stale:
            states[topic] = {**state, "open": [], "last": last}  # classes, feed: kept
    return ends, states
