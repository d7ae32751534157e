"""The demo's events: a subscriber on the daemon's events endpoint that prints each event
start and end as it arrives (the same messages any site's subscriber gets)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable

from stgcnd_client import Events


class EventPrinter(threading.Thread):
    def __init__(self, endpoint: str, say: Callable[[str], None]) -> None:
        super().__init__(name="demo-events", daemon=True)
        self.endpoint, self.say = endpoint, say
        self.stop = threading.Event()
        self.started_events = 0
        self.ended_reasons: Counter[str] = Counter()  # reason -> events that ended so
        self._subscribed = threading.Event()

    def run(self) -> None:
        with Events(self.endpoint) as events:
            self._subscribed.set()
            while not self.stop.is_set():
                event = events.recv(timeout_ms=100)
                if event is None or event["kind"] not in ("start", "end"):
                    continue  # a snapshot: the printer subscribed before any event
                start = event["kind"] == "start"
                at = time.strftime("%H:%M:%S", time.localtime(
                    float(event["started"] if start else event["ended"])))
                if start:
                    self.started_events += 1
                    self.say(f"event {event['id']}: {event['class']} started on "
                             f"{event['camera']} at {at} (probability {event['probability']})")
                else:
                    self.ended_reasons[str(event["reason"])] += 1
                    self.say(f"event {event['id']}: ended at {at} after "
                             f"{event['duration_s']} s, peak {event['peak']} "
                             f"({event['reason']})")

    def wait_subscribed(self, timeout: float = 2.0) -> None:
        # PUB/SUB: a subscription reaches the publisher a moment after connecting.
        self._subscribed.wait(timeout)
        time.sleep(0.2)

    def finish(self, linger: float = 1.0) -> None:
        """Stop after the daemon's shutdown events had `linger` seconds to arrive."""
        time.sleep(linger)
        self.stop.set()
        self.join(2.0)
