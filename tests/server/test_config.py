from __future__ import annotations

import re
from pathlib import Path

import pytest
from msgspec.structs import fields

from stgcnd.errors import UserError
from stgcnd.server.config import NON_CONFIG_ENV, ServerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
DEMO = '[[models]]\nname = "demo"\ndemo = true\n'


def test_example_config_loads():
    cfg = load_config(REPO / "systemd" / "stgcnd.toml", env={})
    assert cfg.endpoint == "ipc:///run/stgcnd/stgcnd.sock"
    m = cfg.models[0]
    assert m.name == "single" and m.precision == "fp16" and m.labels == ("normal", "shoplifting")


def test_defaults_serve_the_demo_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert cfg.models[0].checkpoint is None and cfg.models[0].demo
    assert cfg.endpoint.startswith("ipc://")


def test_env_and_flags_override(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[server]\nstats_interval = 10.0\nqueue_size = 4\n' + DEMO)
    cfg = load_config(p, env={"STGCND_STATS_INTERVAL": "2.5"}, overrides={"queue_size": 9})
    assert cfg.server.stats_interval == 2.5 and cfg.server.queue_size == 9


@pytest.mark.parametrize("text,match", [
    ('[server]\nendpont = "x"\n', "unknown key.*endpont"),
    ('[sever]\n', "unknown section"),
    ('[[models]]\nname = "a"\ndemo = true\nbackend = "cuda"\n', "backend must be"),
    ('[[models]]\nname = "a"\ndemo = true\n[[models]]\nname = "a"\ndemo = true\n',
     "more than one model is named 'a'.*its own name"),
    ('[[models]]\nname = "a"\npersons = "two"\n', "persons: invalid.*expected an integer"),
    ('[[models]]\nname = "a"\ndemo = true\nmin_interval_ms = -1\n',
     r"min_interval_ms must be in 0\.\.3600000 ms \(0: off\), got -1"),
    ('[server\n', "invalid TOML"),
])
def test_bad_configs(tmp_path, text, match):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        load_config(p, env={})


def test_bad_env_value_names_the_variable_not_the_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[server]\nstats_interval = 10.0\n" + DEMO)
    for path in (None, p):
        with pytest.raises(UserError) as info:
            load_config(path, env={"STGCND_STATS_INTERVAL": "five", "STGCND_CONFIG": ""})
        assert str(info.value) == ("environment variable STGCND_STATS_INTERVAL: invalid value "
                                   "'five' (expected a number)")
    with pytest.raises(UserError, match=r"^environment variable STGCND_QUEUE_SIZE: queue_size "
                                        r"must be >= 1, got 0$"):
        load_config(p, env={"STGCND_QUEUE_SIZE": "0"})


def test_bad_toml_and_flag_values_name_their_source(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[server]\nstats_interval = "five"\n' + DEMO)
    with pytest.raises(UserError, match=rf"^{p} \[server\] stats_interval: invalid value 'five' "
                                        r"\(expected a number\)$"):
        load_config(p, env={})
    p.write_text("[server]\nstats_interval = 0\n" + DEMO)
    with pytest.raises(UserError, match=rf"^{p} \[server\] stats_interval: .*> 0 seconds"):
        load_config(p, env={})
    with pytest.raises(UserError, match=r"^flag --stats-interval: .*must be > 0 seconds, got "
                                        r"-1\.0$"):
        load_config(None, env={}, overrides={"stats_interval": -1.0},
                    flag_names={"stats_interval": "--stats-interval"})
    with pytest.raises(UserError, match=r"^flag --queue-size: invalid value 'x'"):
        load_config(None, env={}, overrides={"queue_size": "x"})


def test_misspelt_variable_is_an_error_with_a_suggestion():
    with pytest.raises(UserError) as info:
        load_config(None, env={"STGCND_STATS_INTERVALL": "5"})
    msg = str(info.value)
    assert msg.startswith("environment variable STGCND_STATS_INTERVALL is not one stgcnd knows; "
                          "did you mean STGCND_STATS_INTERVAL?")
    assert "STGCND_ENDPOINT" in msg and "STGCND_CONFIG, STGCND_ENGINE_DIR" in msg


def test_non_config_variables_are_allowed(tmp_path):
    env = {name: str(tmp_path) for name in NON_CONFIG_ENV if name != "STGCND_CONFIG"}
    load_config(None, env={**env, "STGCND_CONFIG": "", "STGCND_ENDPOINT": "ipc:///tmp/a.sock"})


def test_every_stgcnd_variable_the_repository_reads_is_known():
    # Any STGCND_* name in the code, tests or scripts must be a [server] key or allow-listed,
    # or setting it would make the daemon refuse to start.
    keys = {f"STGCND_{f.name.upper()}" for f in fields(ServerConfig)}
    used = set()
    for folder in ("daemon", "tests", "scripts", "systemd", "clients"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".toml", ".service", ".md") or path.name == "run":
                used |= set(re.findall(r"STGCND_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    unknown = used - keys - set(NON_CONFIG_ENV) - {"STGCND_KEY", "STGCND_STATS_INTERVALL"}
    assert not unknown, f"add to NON_CONFIG_ENV or rename: {sorted(unknown)}"


def test_named_model_without_checkpoint_must_say_demo(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[[models]]\nname = "shoplifting"\n')
    with pytest.raises(UserError) as info:
        load_config(p, env={})
    assert str(info.value) == (
        f"{p}: model 'shoplifting': no checkpoint; add checkpoint = \"/path/to/model.pt\" to "
        "serve your model, or demo = true to serve the demo model (random weights: its "
        "predictions mean nothing)")
    p.write_text('[[models]]\nname = "shoplifting"\ndemo = true\n')
    assert load_config(p, env={}).models[0].demo
    p.write_text(f'[[models]]\nname = "s"\ndemo = true\ncheckpoint = "{tmp_path / "m.pt"}"\n')
    with pytest.raises(UserError, match="both demo = true and a checkpoint"):
        load_config(p, env={})
    p.write_text("[server]\nqueue_size = 4\n")
    with pytest.raises(UserError, match=r"no \[\[models\]\] entry.*demo = true"):
        load_config(p, env={})


def test_relative_paths_in_the_file_are_relative_to_its_directory(tmp_path, monkeypatch):
    # One store and the same files whatever directory the daemon is started from; a path
    # given as a flag or variable is relative to the current directory, as in a shell.
    etc = tmp_path / "etc"
    etc.mkdir()
    p = etc / "c.toml"
    p.write_text('[server]\nengines_dir = "engines"\n[[models]]\ncheckpoint = "m/a.pt"\n'
                 f'calibration = "{tmp_path / "w.npz"}"\n')
    for cwd in (tmp_path, etc):
        monkeypatch.chdir(cwd)
        cfg = load_config(p.relative_to(cwd), env={})
        assert cfg.engines_dir == etc / "engines"
        assert cfg.models[0].checkpoint == str(etc / "m" / "a.pt")
        assert cfg.models[0].calibration == str(tmp_path / "w.npz")
    assert load_config(p, env={"STGCND_ENGINES_DIR": "e"}).engines_dir == Path("e")
    assert load_config(p, env={}, overrides={"engines_dir": "f"}).engines_dir == Path("f")


def test_an_unnamed_model_is_named_after_its_checkpoint(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[[models]]\ncheckpoint = "/m/epoch60_model.pt"\n[[models]]\ndemo = true\n'
                 '[[models]]\nname = "b"\ncheckpoint = "/m/b.onnx"\n')
    assert [m.name for m in load_config(p, env={}).models] == ["epoch60_model", "demo", "b"]
    p.write_text('[[models]]\ncheckpoint = "/m/a/model.pt"\n'
                 '[[models]]\ncheckpoint = "/m/b/model.pt"\n')
    with pytest.raises(UserError, match=r"more than one model is named 'model' \(a model "
                                        r"without a name is named after its checkpoint"):
        load_config(p, env={})


REPO = Path(__file__).resolve().parents[2]


def test_the_annotated_example_is_made_from_the_schema_and_loads(tmp_path):
    from stgcnd.server.config_docs import example

    assert (REPO / "systemd" / "stgcnd.toml").read_text() == example(), \
        "regenerate it: stgcnd docs --write"
    path = tmp_path / "stgcnd.toml"
    path.write_text(example())
    cfg = load_config(path, env={})
    assert cfg.models[0].checkpoint and cfg.models[0].labels == ("normal", "shoplifting")
    assert cfg.server.queue_size == ServerConfig().queue_size


def test_the_readme_lists_every_key_from_the_schema():
    from stgcnd.server.config_docs import key_table

    readme = (REPO / "README.md").read_text()
    assert key_table() in readme, "regenerate the README's table: stgcnd docs --write"


@pytest.mark.parametrize("line, message", [
    ("queue_size = 33.3", "invalid value 33.3 (expected an integer)"),
    ("stats_interval = true", "invalid value True (expected a number)"),
    ("log_level = \"loud\"", "invalid value 'loud'"),
])
def test_values_of_the_wrong_type_are_refused_not_coerced(tmp_path, line, message):
    path = tmp_path / "c.toml"
    path.write_text(f"[server]\n{line}\n[[models]]\ndemo = true\n")
    with pytest.raises(UserError) as info:
        load_config(path, env={})
    assert f"[server] {line.split()[0]}: {message}" in str(info.value)


def test_engine_keys_and_policy_keys_split_the_model_section():
    from stgcnd.server.config import ModelConfig

    base = ModelConfig(demo=True)
    policy = ModelConfig(demo=True, labels=("a", "b"), stride=5, max_queue_delay_us=200)
    assert policy.engine == base.engine and policy != base
    assert ModelConfig(demo=True, threads=2).engine != base.engine


def test_every_key_says_what_a_reload_does_with_it():
    """#33: keys a reload silently did not re-apply. Every key is declared policy (applied at
    once), engine (models loaded anew) or restart (logged as waiting for one); a model's or
    the events' keys are never restart-only (a reload loads models, whatever changed)."""
    from stgcnd.server.config import (
        APPLIES,
        RESTART,
        SERVER_ENGINE,
        EventsConfig,
        ModelConfig,
        schema,
    )

    tags = {(cls.__name__, name): meta.applies
            for cls in (ServerConfig, ModelConfig, EventsConfig)
            for name, _, meta in schema(cls)}
    assert set(tags.values()) == set(APPLIES)
    assert not [k for k, tag in tags.items() if k[0] != "ServerConfig" and tag == "restart"]
    assert "queue_size" not in RESTART and "stats_interval" not in RESTART
    assert "warmup_runs" in SERVER_ENGINE and "endpoint" in RESTART
