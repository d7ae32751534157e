"""Snapshot requests on the events socket: which subscriber asked for a snapshot of the open
events, and when it gets it. An XPUB sends a snapshot on its cameras' topics, so every
subscriber of those topics receives it, not only the one that asked: one subscriber toggling
its subscription made every other one receive the open events over and over (x13 in 8 s,
issue #41). So an ask is answered at once (with the others of the next SNAPSHOT_EVERY_S) only
when it is *free*: its subscriber's (connection's) first, while its peer (server/peers.py) has
not used PEER_SNAPSHOT_BURST free asks since it was last quiet for SNAPSHOT_INTERVAL_S. Every
other ask waits, and all waiting asks, of every peer,
are answered together once per SNAPSHOT_INTERVAL_S: churn, from any number of peers, costs
the other subscribers at most one snapshot an interval, and an ask is never dropped (a
subscriber recovering from a gap needs its snapshot). A peer sending more than
PEER_SUBSCRIPTION_MESSAGES (un)subscriptions in one interval, over all its connections, is
over the limit (the caller refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SNAPSHOT_EVERY_S = 0.2      # free asks of this long are answered together
SNAPSHOT_INTERVAL_S = 10.0  # all waiting asks are answered together, this far apart
PEER_SNAPSHOT_BURST = 8     # free asks a peer has (subscribers it starts) until quiet again
MAX_ASK_TOPICS = 16         # topics one waiting ask keeps; more merge into their common prefix
PEER_SUBSCRIPTION_MESSAGES = 8192  # (un)subscriptions a peer may send per SNAPSHOT_INTERVAL_S


@dataclass
class _Ask:
    ino: int                    # the connection's socket: an fd number may be reused
    peer: str
    free: bool                  # answered at the next batch; else with the waiting ones
    topics: set[bytes] = field(default_factory=set)


class SnapshotAsks:
    """The snapshots asked for and not sent yet; see the module's docstring."""

    def __init__(self, interval_s: float = SNAPSHOT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._asks: dict[int, _Ask] = {}                     # fd -> its ask not answered yet
        self._answered: dict[int, int] = {}  # fd -> ino: connections that had a snapshot
        self._peers: dict[str, tuple[int, float]] = {}       # peer -> (free asks used, last ask)
        self._volume: dict[str, tuple[float, int]] = {}      # peer -> (window ends, messages)
        self._refused: set[str] = set()  # peers over the volume, told of this window
        self._next_batch = 0.0    # free asks: the next SNAPSHOT_EVERY_S
        self._next_waiting = 0.0  # waiting asks: once an interval
        self.sent = 0       # snapshots answered (asks: several may share one)
        self.deferred = 0   # asks that were not free

    def over(self, peer: str, now: float) -> bool:
        """Count one (un)subscription of `peer`; True once it sent more than
        PEER_SUBSCRIPTION_MESSAGES in the current interval (the caller refuses it)."""
        ends, sent = self._volume.get(peer, (0.0, 0))
        if now >= ends:
            ends, sent = now + self.interval_s, 0
            self._refused.discard(peer)
        self._volume[peer] = (ends, sent + 1)
        return sent >= PEER_SUBSCRIPTION_MESSAGES

    def first_refusal(self, peer: str) -> bool:
        """True the first time in its interval that `peer` is refused (logged once)."""
        first = peer not in self._refused
        self._refused.add(peer)
        return first

    def subscribe(self, fd: int, ino: int, peer: str, topic: bytes, now: float) -> None:
        ask = self._asks.get(fd)
        if ask is None or ask.ino != ino:
            ask = self._asks[fd] = _Ask(ino, peer, self._free(fd, ino, peer, now))
            self.deferred += not ask.free
        if not any(topic.startswith(t) for t in ask.topics):  # else already answered by one
            ask.topics.add(topic)
        if len(ask.topics) > MAX_ASK_TOPICS:  # what they match is in their prefix's snapshot
            ask.topics = {common_prefix(ask.topics)}

    def unsubscribe(self, fd: int, ino: int, topic: bytes) -> None:
        """A topic dropped before its snapshot went: no longer asked for (a SUB sends an
        unsubscription only when it holds the topic no more)."""
        ask = self._asks.get(fd)
        if ask is not None and ask.ino == ino:
            ask.topics.discard(topic)
            if not ask.topics:
                del self._asks[fd]

    def due(self, now: float) -> set[bytes]:
        """The topics to answer now (empty: none): the free asks at most every
        SNAPSHOT_EVERY_S, with them the waiting ones once their interval is up."""
        if not self._asks or now < self._next_batch:
            return set()
        gate_open = now >= self._next_waiting
        served = [fd for fd, ask in self._asks.items() if ask.free or gate_open]
        if not served:
            return set()
        topics: set[bytes] = set()
        waiting = False
        for fd in served:
            ask = self._asks.pop(fd)
            topics |= ask.topics
            self._answered[fd] = ask.ino
            waiting = waiting or not ask.free
        self.sent += 1
        self._next_batch = now + SNAPSHOT_EVERY_S
        if waiting:
            self._next_waiting = now + self.interval_s
        return topics

    def tidy(self, live: dict[int, int], now: float) -> None:
        """Forget connections gone (`live`: fd -> inode) and what is older than an interval
        (every stats tick): the tables hold live connections and recent peers only."""
        for fd in [fd for fd, a in self._asks.items() if live.get(fd) != a.ino]:
            del self._asks[fd]
        recent = now - self.interval_s
        self._answered = {fd: ino for fd, ino in self._answered.items() if live.get(fd) == ino}
        self._peers = {p: v for p, v in self._peers.items() if v[1] > recent}
        self._volume = {p: v for p, v in self._volume.items() if v[0] > now}
        self._refused &= self._volume.keys()

    def _free(self, fd: int, ino: int, peer: str, now: float) -> bool:
        """Whether a new ask is answered at once; the peer's ask is counted either way."""
        used, last = self._peers.get(peer, (0, float("-inf")))
        if now - last >= self.interval_s:
            used = 0  # quiet for an interval: its burst is back
        free = self._answered.get(fd) != ino and used < PEER_SNAPSHOT_BURST
        self._peers[peer] = (used + free, now)
        return free

def common_prefix(topics: set[bytes]) -> bytes:
    """The longest prefix of every topic: the smallest and the largest share it."""
    low, high = min(topics), max(topics)
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[:n]
