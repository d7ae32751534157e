"""docs/protocol.md §10 describes the CURVE key files exactly (issue #32, item 8.7), so that a
camera in another language can read its keys: what `stgcnd keys create` writes has the shape
the document shows, and a file written from the description alone is read by the daemon and
by the Python client."""

from __future__ import annotations

import re
from pathlib import Path

import zmq

from stgcnd.cli import main as stgcnd
from stgcnd.server.curve import read_key
from stgcnd_client.curve import curve_options
from tests.conftest import REPO

SECTION = re.search(r"^## 10\. .*?(?=^## )", (REPO / "docs" / "protocol.md").read_text(),
                    re.M | re.S)
assert SECTION, "docs/protocol.md has no section 10"
KEY_FILE = re.search(r"\*\*Key files\.\*\*.*?```\n(.*?)```", SECTION.group(0), re.S)
assert KEY_FILE, "section 10 shows no key file"
DOC_KEY_FILE = KEY_FILE.group(1)
Z85 = r'"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}"'


def shape(text: str) -> list[str]:
    """A key file's lines without comments and blank lines, keys replaced by <key>."""
    return [re.sub(Z85, '"<key>"', line) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def public_key_of(text: str) -> str:
    """The reader the document describes, written from it alone."""
    for line in text.splitlines():
        if line.lstrip().startswith("public-key"):
            return line.split("=", 1)[1].strip(" \t\"'")
    raise AssertionError("no public-key line")


def test_the_documented_file_is_read_by_the_daemon_and_the_client(tmp_path):
    path = tmp_path / "door-box.key"
    path.write_text(DOC_KEY_FILE)
    key = read_key(path)
    assert key.public == public_key_of(DOC_KEY_FILE) and len(key.public) == 40
    assert key.cameras == ("door-1", "door-2")
    pair = tuple(k.decode() for k in zmq.curve_keypair())
    options = dict(curve_options(path, pair))
    assert options[zmq.CURVE_SERVERKEY] == key.public.encode()


def test_a_minimal_file_by_the_grammar_is_enough(tmp_path):
    public, _ = zmq.curve_keypair()
    path = tmp_path / "cam.key"
    path.write_text(f'curve\n    public-key = "{public.decode()}"\n')
    assert read_key(path).public == public.decode() and read_key(path).cameras == ()


def test_stgcnd_keys_writes_what_the_document_shows(tmp_path):
    config = tmp_path / "stgcnd.toml"
    config.write_text(f'[server]\nkeys_dir = "{tmp_path / "keys"}"\n[[models]]\ndemo = true\n')
    out = tmp_path / "out"
    assert stgcnd(["keys", "--config", str(config), "create", "door-box", "--cameras",
                   "door-1", "door-2", "--out", str(out)]) == 0
    public = (out / "door-box.key").read_text()
    assert shape(public) == shape(DOC_KEY_FILE)
    assert public.splitlines()[1:5] == DOC_KEY_FILE.splitlines()[1:5]  # the banner
    secret = (out / "door-box.key_secret").read_text()
    assert shape(secret) == ["metadata", "    cameras = door-1 door-2", "curve",
                             '    public-key = "<key>"', '    secret-key = "<key>"']
    authorized = Path(tmp_path / "keys" / "authorized" / "door-box.key")
    assert authorized.read_text() == public
    assert public_key_of(secret) == public_key_of(public)
