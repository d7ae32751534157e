"""Which class names [models.events] may use (issue #32, item 8.10): a model's own labels,
whoever gives them. The demo model without labels has the classes normal and abnormal, so
its events may name them; a checkpoint without labels may carry its own, so its names are
checked once it is loaded."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from stgcnd.errors import UserError
from stgcnd.server.config import EventsConfig, check_event_classes, load_config
from stgcnd_client import Client
from tests.server.daemon_harness import Daemon, stop_by_pid

DEMO_WITHOUT_LABELS = """[[models]]
name = "demo"
backend = "noop"
demo = true
frames = 30
[models.events]
enter = 0.5
exit = 0.4
min_duration_s = 0.0
quiet_classes = {quiet}
min_usable = 0.0
"""


def load(models: str):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_text(textwrap.dedent(models))
        return load_config(path, env={})


def test_the_demo_models_classes_are_known_without_labels():
    config = load(DEMO_WITHOUT_LABELS.format(quiet='["normal"]')
                  + "[models.events.classes.abnormal]\nenter = 0.6\n")
    assert config.models[0].events.quiet_classes == ("normal",)


def test_a_class_the_demo_model_does_not_have_is_refused_with_its_classes():
    with pytest.raises(UserError, match=r"'shoplifting', not one of the model's labels "
                                        r"\['normal', 'abnormal'\]"):
        load(DEMO_WITHOUT_LABELS.format(quiet='["shoplifting"]'))


def test_a_checkpoints_classes_are_checked_once_its_labels_are_known(tmp_path):
    checkpoint = tmp_path / "m.pt"
    checkpoint.write_bytes(b"")
    config = load(f'[[models]]\ncheckpoint = "{checkpoint}"\n[models.events]\n'
                  'quiet_classes = ["idle"]\n')  # its labels are in the checkpoint, if any
    events = config.models[0].events
    check_event_classes(events, ("idle", "theft"), "model 'm'")
    with pytest.raises(UserError, match="names class 'idle'"):
        check_event_classes(events, ("normal", "abnormal"), "model 'm'")
    check_event_classes(EventsConfig(), (), "model 'm'")  # names none: nothing to check


@pytest.mark.slow
def test_a_demo_daemon_without_labels_raises_events_of_its_second_class(tmp_path):
    d = Daemon(tmp_path, models=DEMO_WITHOUT_LABELS.format(quiet='["normal"]')).start()
    try:
        with Client(d.endpoint, camera_id="cam1") as client:
            assert client.hello().models[0].labels == ("normal", "abnormal")
            client.infer(np.zeros((3, 30, 33, 1), np.float32))
    finally:
        stop_by_pid(d)
    events = [(e["kind"], e["class"]) for e in d.log_events() if e["event"] == "action_event"]
    assert events == [("start", "abnormal"), ("end", "abnormal")]
