"""A ROUTER that is a CURVE server, as the daemon's is, for tests of refused handshakes."""

from __future__ import annotations

import zmq


def curve_server_router(ctx: zmq.Context) -> tuple[zmq.Socket, bytes]:
    """(an unbound CURVE-server ROUTER, its public key): bind it after whatever must watch
    it from the start (a monitor)."""
    public, secret = zmq.curve_keypair()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.CURVE_SERVER, 1)
    router.setsockopt(zmq.CURVE_SECRETKEY, secret)
    return router, public
