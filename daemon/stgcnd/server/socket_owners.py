"""Which process holds a socket, by the socket's inode, for the loopback tcp peers
(peers.accepted_peer): the kernel says which user owns the client's end of a connection
(NETLINK_SOCK_DIAG) and its inode, but not its process; /proc/PID/fd does, for the processes
the daemon may see."""

from __future__ import annotations

import os
import time

SCAN_BUDGET_S = 0.05   # seconds a second of /proc scans: at most 5 % of the I/O loop
SCAN_MAX_S = 0.02      # one scan stops here (a process may hold 100,000 fds)


# There is no index from a socket to its process: a lookup reads the fd links of every
# process of the socket's user (/proc/PID is owned by the process's user; with systemd's
# ProtectProc=invisible, as in systemd/stgcnd.service, only the daemon's own user's processes
# are there at all), 3-5 ms for 500 fds on the 2-core VM. So a scan remembers every socket it
# saw (the 70 connections a process opens at once cost one scan, not 70), and a flood of
# connects cannot buy more than SCAN_BUDGET_S of the loop a second: past it, or where the
# process cannot be seen, the caller keys the connection by its user, as before.
class SocketOwners:
    def __init__(self, proc: str = "/proc", budget_s: float = SCAN_BUDGET_S,
                 scan_max_s: float = SCAN_MAX_S) -> None:
        self.proc = proc
        self.budget_s = budget_s
        self.scan_max_s = scan_max_s
        self._owner: dict[int, int] = {}   # socket inode -> pid, from the latest scan
        self._second = 0.0                 # the second the budget counts from
        self._spent = 0.0
        self.scans = 0
        self.over_budget = 0               # lookups refused a scan (the key fell back)

    def process(self, inode: int, uid: int) -> int | None:
        """The pid of a process of user `uid` holding socket `inode`; None when none is
        found or this second's scan budget is spent."""
        pid = self._owner.get(inode)
        if pid is not None:
            return pid
        start = time.monotonic()
        if start - self._second >= 1.0:
            self._second, self._spent = start, 0.0
        elif self._spent >= self.budget_s:
            self.over_budget += 1
            return None
        self._owner = self._scan(uid, start + self.scan_max_s)
        self.scans += 1
        self._spent += time.monotonic() - start
        return self._owner.get(inode)

    def _scan(self, uid: int, deadline: float) -> dict[int, int]:
        owner: dict[int, int] = {}
        try:
            entries = [e for e in os.scandir(self.proc) if e.name.isdigit()]
        except OSError:
            return owner
        # Newest processes first: a scan cut short by its deadline has then looked at the
        # ones most likely to have just connected.
        entries.sort(key=lambda e: -int(e.name))
        for entry in entries:
            try:
                if entry.stat().st_uid != uid:
                    continue
                fds = f"{entry.path}/fd"
                names = os.listdir(fds)
            except OSError:  # gone, or not ours to read
                continue
            pid = int(entry.name)
            for i, name in enumerate(names):
                if i & 511 == 511 and time.monotonic() > deadline:
                    break
                try:
                    link = os.readlink(f"{fds}/{name}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner.setdefault(int(link[8:-1]), pid)
            if time.monotonic() > deadline:
                break
        return owner


SOCKET_OWNERS = SocketOwners()
