"""Why the MQTT broker cannot be reached, in a word a site can act on, and what to check.

paho retries every 1 to 30 s; what failed at each attempt is one of a few reasons (`REASONS`),
each with the fix a site would look for. The sink (server/mqtt_sink.py) says a reason once,
when it changes, so a wrong password is one line, not one a retry.
"""

from __future__ import annotations

import errno
import socket
import ssl

from paho.mqtt.reasoncodes import ReasonCode

# reason -> what to check. The keys are the `reason` field of `mqtt_unreachable`
# (docs/logging.md lists them).
REASONS = {
    "dns": "the broker's host name does not resolve: check [events.mqtt] broker and this "
           "host's DNS (/etc/resolv.conf, /etc/hosts)",
    "refused": "nothing listens at the broker's address: check [events.mqtt] broker (host "
               "and port: 1883 for mqtt://, 8883 for mqtts://) and that the broker runs",
    "timeout": "the broker did not answer in time: check the address, a firewall on the "
               "way, and that the broker is not overloaded",
    "tls": "the TLS handshake failed: check that the port is the broker's TLS listener, "
           "[events.mqtt] ca_file (it must sign the broker's certificate, issued for the "
           "host name in broker), cert_file and key_file",
    "auth": "the broker refused the credentials: check [events.mqtt] username/password_file "
            "and the broker's password file and ACL",
    "blocked": "this host refused to open the connection: the shipped systemd unit allows "
               "loopback only (IPAddressDeny=any); for a broker on another host add its "
               "address to IPAddressAllow (docs/protocol.md, Events over MQTT)",
    "other": "see `error`; check [events.mqtt] broker and the broker's own log",
}

# CONNACK refusals that are the credentials' fault (MQTT 3.1.1 return codes 4 and 5 as paho
# names them, and their MQTT 5 counterparts).
KEEPALIVE_TIMEOUT = 141  # the MQTT 5 reason code paho gives a keepalive it lost, on 3.1.1 too
_AUTH_CODES = {"Bad user name or password", "Not authorized", "Bad authentication method"}


def why_failed(exc: BaseException | None, tls: bool) -> str:
    """The reason for a connection attempt that raised `exc` (None: paho did not say);
    `tls`: the broker is mqtts://."""
    if isinstance(exc, socket.gaierror):
        return "dns"
    # Before OSError's kinds: a certificate error is an OSError too.
    if isinstance(exc, (ssl.SSLError, ssl.CertificateError)):
        return "tls"
    # A TCP connection is refused, never reset, while it opens: a reset or an end on an
    # mqtts:// connection is the handshake's (a plain listener, such as Mosquitto's, reads
    # the ClientHello as a malformed MQTT packet and drops the connection).
    if tls and isinstance(exc, (ConnectionResetError, ConnectionAbortedError)):
        return "tls"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, socket.timeout):  # TimeoutError on 3.10+, its own class on 3.8 and 3.9
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES):
        return "blocked"  # systemd's IPAddressDeny answers connect() with EPERM
    return "other"


def why_dropped(reason: ReasonCode) -> str | None:
    """The reason for a connection paho dropped before any CONNACK came (None: not a failure
    of its own: a refusal's CONNACK has said why already)."""
    return "timeout" if reason.value == KEEPALIVE_TIMEOUT else None


def why_refused(reason: ReasonCode) -> str:
    """The reason for a CONNACK that refused the connection."""
    return "auth" if str(reason) in _AUTH_CODES else "other"
