"""Who a connection belongs to: its *peer*, by which camera slots are shared and bans refuse
(the comment above peer_key says who is keyed how)."""

from __future__ import annotations

import itertools
import os
import socket
import struct

from stgcnd.server.socket_owners import SOCKET_OWNERS

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LOOPBACK = ("127.", "::1", "::ffff:127.")


# The peer of a request (`peer_key`) comes from the connection's own metadata (Peer-Address),
# not from its fd number, which a new connection may reuse: the process for an ipc client
# (SO_PEERCRED; the camera table shares slots by it, bans refuse it) and the address for tcp. A
# tcp client on the loopback is its process where the daemon can see it, else its user: at
# accept, the kernel is asked who owns the client's end of the connection (NETLINK_SOCK_DIAG,
# an exact 4-tuple lookup: its uid and its socket's inode), and the inode is looked for in
# /proc/PID/fd (socket_owners.py, within a time budget), so a hundred loopback connections of
# one process are one peer, and two processes of one user two. That key is kept by fd
# (`Connections.loopback`, dropped on the fd's disconnect or a new accept on its number) and
# looked up by fd for each request from the loopback. Without netlink (or when the client's
# socket is gone by then), and for a process in another pid namespace (pid 0), the key is the
# connection: those keys would otherwise lump unrelated clients together. A loopback user, like
# a connection, is never banned as a whole: a ban closes the connection only.
def peer_key(address: str, fd: int, loopback: dict[int, str] | None = None) -> str:
    """The peer of connection `fd` from its Peer-Address metadata: 'localhost:UID:GID:PID'
    for ipc, the IP for tcp; for the loopback, the process or user found at accept
    (`loopback`, by fd: Connections.loopback). See the comment above for who is keyed per
    connection."""
    if address.startswith("localhost:"):
        pid = address.rsplit(":", 1)[-1]
        if pid not in ("", "0"):
            return f"pid:{pid}"
    elif address and not address.startswith(_LOOPBACK):
        return f"ip:{address}"
    elif loopback:
        key = loopback.get(fd)
        if key is not None:
            return key
    return f"fd:{fd}"


def keyed_per_connection(peer: str) -> bool:
    """A peer a ban refuses one connection of, never as a whole: a connection, or a loopback
    user (whose other processes are not the abuser)."""
    return peer.startswith(("fd:", "uid:"))


def accepted_peer(fd: int) -> tuple[str, int] | None:
    """(peer key, inode) of an accepted connection's fd, asked of the kernel (the same key
    `peer_key` makes from a message's metadata, given the loopback processes and users found
    here); None when the fd is gone or not a socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        ino = os.fstat(fd).st_ino
        if sock.family == socket.AF_UNIX:
            pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            return peer_key(f"localhost:{uid}:{gid}:{pid}", fd), ino
        peer = sock.getpeername()
        address = str(peer[0])
        if address.startswith(_LOOPBACK):
            owner = loopback_owner(sock.family, peer, sock.getsockname())
            if owner is not None:
                pid = SOCKET_OWNERS.process(owner[1], owner[0])
                return (f"uid:{owner[0]}" if pid is None else f"pid:{pid}"), ino
        return peer_key(address, fd), ino
    except OSError:
        return None
    finally:
        sock.detach()  # the fd is libzmq's: never closed here


# -- who owns the client's end of a loopback tcp connection (NETLINK_SOCK_DIAG) --------------
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")        # nlmsghdr: len, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBBI")     # inet_diag_req_v2: family, protocol, ext, pad, states
_PORTS = struct.Struct("!HH")           # inet_diag_sockid: sport, dport (big-endian) ...
_TAIL = struct.Struct("=III")           # ... if, cookie (INET_DIAG_NOCOOKIE)
_UID_INODE = struct.Struct("=II")       # inet_diag_msg's idiag_uid, idiag_inode
_UID_AT = _NLMSG.size + 4 + 48 + 12     # after family..retrans, the sockid, expires/queues
_diag: list[socket.socket | None] = []  # the netlink socket, opened on first use ([None]: none)
_diag_seq = itertools.count(1)


def loopback_owner(family: int, peer: tuple, local: tuple  # type: ignore[type-arg]
                   ) -> tuple[int, int] | None:
    """(uid, inode) of the client's socket of a loopback tcp connection, from our ends'
    addresses (peer, local: getpeername/getsockname); None where it cannot be asked."""
    if not _diag:
        try:
            opened = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
            opened.settimeout(0.05)
            _diag.append(opened)
        except (OSError, AttributeError):  # no netlink (not Linux, or a sandbox)
            _diag.append(None)
    nl = _diag[0]
    if nl is None:
        return None
    try:
        # The client's socket: its source is our peer, its destination our local end.
        src = socket.inet_pton(family, peer[0]).ljust(16, b"\0")
        dst = socket.inet_pton(family, local[0]).ljust(16, b"\0")
        seq = next(_diag_seq) & 0xFFFFFFFF
        body = (_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
                + _PORTS.pack(peer[1], local[1]) + src + dst
                + _TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF))
        nl.send(_NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                            seq, 0) + body)
        for _ in range(8):  # a late answer to an earlier, timed-out question comes first
            reply = nl.recv(8192)
            _, kind, _, got, _ = _NLMSG.unpack_from(reply)
            if got != seq:
                continue
            if kind == _NLMSG_ERROR or len(reply) < _UID_AT + _UID_INODE.size:
                return None  # ENOENT: the client's socket is gone already
            uid, inode = _UID_INODE.unpack_from(reply, _UID_AT)
            return int(uid), int(inode)
    except (OSError, ValueError, struct.error):
        return None
    return None
