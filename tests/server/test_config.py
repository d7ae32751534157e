from __future__ import annotations

from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd.server.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_example_config_loads():
    cfg = load_config(REPO / "systemd" / "stgcnd.toml", env={})
    assert cfg.endpoint == "ipc:///run/stgcnd/stgcnd.sock"
    m = cfg.models[0]
    assert m.name == "single" and m.precision == "fp16" and m.labels == ("normal", "shoplifting")


def test_defaults_serve_the_demo_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert cfg.models[0].checkpoint is None and cfg.endpoint.startswith("ipc://")


def test_env_and_flags_override(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[server]\nstats_interval = 10.0\nqueue_size = 4\n')
    cfg = load_config(p, env={"STGCND_STATS_INTERVAL": "2.5"}, overrides={"queue_size": 9})
    assert cfg.server.stats_interval == 2.5 and cfg.server.queue_size == 9


@pytest.mark.parametrize("text,match", [
    ('[server]\nendpont = "x"\n', "unknown key.*endpont"),
    ('[sever]\n', "unknown section"),
    ('[[models]]\nname = "a"\nbackend = "cuda"\n', "backend must be"),
    ('[[models]]\nname = "a"\n[[models]]\nname = "a"\n', "unique"),
    ('[[models]]\nname = "a"\npersons = "two"\n', "persons: invalid"),
    ('[server\n', "invalid TOML"),
])
def test_bad_configs(tmp_path, text, match):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        load_config(p, env={})


def test_bad_env_value(tmp_path):
    with pytest.raises(UserError, match="stats_interval"):
        load_config(None, env={"STGCND_STATS_INTERVAL": "often", "STGCND_CONFIG": ""})
