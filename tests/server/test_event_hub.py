"""Issue #44: the events are one subsystem (server/event_hub.py), and a serving process loads
its rules only where a model has [models.events], its subscriber socket, heartbeats,
snapshots and MQTT only where events_endpoint or [events.mqtt] is set; skeleton quality and
feed health are every daemon's. Each case is a fresh process that makes the daemon (its
models loaded, its sockets bound) and says which of those modules it holds, then which after
a reload that watches a model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server.daemon_harness import write_config
from tests.server.test_events import NOOP_EVENTS

OPTIONAL = ("stgcnd.server.events", "stgcnd.server.event_publisher", "stgcnd.server.snapshots",
            "stgcnd.server.mqtt_sink")
NOOP = '[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = 30\n'
WATCHED = NOOP_EVENTS.format(exit=0.4)
MAKE = """
import json, sys
from stgcnd.server.config import load_config
from stgcnd.server.models import load_models
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Reloaded, Server
from stgcnd.server.wakeup import Wakeup
held = lambda: sorted(m for m in {optional!r} if m in sys.modules)
config, watched = load_config(sys.argv[1]), load_config(sys.argv[2])
server = Server(config, Wakeup(), Notifier(env={{}}), lambda: config)
made = held()
server._apply(Reloaded(watched, load_models(watched, 2, keep=server.models), {{}}))
assert list(server.events.rules.configs) == ["demo"]  # the reload's rules hold
print(json.dumps([made, held(), server.events.socket is not None]))
"""


def modules_held(tmp_path, models: str, **server: object) -> tuple[list[str], list[str], bool]:
    """(the optional modules held once the daemon is made, and after a reload that watches
    its model; whether it publishes)."""
    endpoint, engines = f"ipc://{tmp_path / 'd.sock'}", tmp_path / "engines"
    path = write_config(tmp_path / "stgcnd.toml", endpoint, engines, models=models, **server)
    reload = write_config(tmp_path / "reload.toml", endpoint, engines, models=WATCHED, **server)
    done = subprocess.run([sys.executable, "-c", MAKE.format(optional=OPTIONAL), str(path),
                           str(reload)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    made, reloaded, publishing = json.loads(done.stdout.strip().splitlines()[-1])
    return made, reloaded, publishing


@pytest.mark.parametrize("models, server, loaded", [
    (NOOP, {}, []),
    (WATCHED, {}, ["stgcnd.server.events"]),
    (NOOP, {"events_endpoint": "ipc://{tmp}/e.sock"},
     ["stgcnd.server.event_publisher", "stgcnd.server.snapshots"]),
], ids=["no-events", "rules", "socket"])
def test_a_daemon_loads_the_events_only_where_they_are_configured(tmp_path, models, server,
                                                                   loaded):
    server = {k: v.format(tmp=tmp_path) for k, v in server.items()}
    made, reloaded, publishing = modules_held(tmp_path, models, **server)
    assert made == loaded
    assert reloaded == sorted({*loaded, "stgcnd.server.events"})  # a reload may watch one
    assert publishing == bool(server)
