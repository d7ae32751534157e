"""`stgcnd keys create|list|revoke|server`: CURVE keys for cameras on other machines.

A client's pair is written where the command is run (--out): its NAME.key_secret goes to the
camera's machine and nowhere else; its public NAME.key is copied into the daemon's authorized
directory, read again on `systemctl reload stgcnd`. The daemon's own pair is made by the
daemon on its first start with CURVE on (so that its owner, not root, owns the secret).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

import zmq.auth

from stgcnd.errors import UserError
from stgcnd.server.config import load_config
from stgcnd.server.curve import SERVER_NAME, authorized_dir, keys_dir, load_authorized

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RELOAD = "then `systemctl reload stgcnd` (or send the daemon SIGHUP)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="make, list and revoke CURVE keys of remote cameras",
                       description="CURVE keys for cameras that reach the daemon over tcp "
                                   "(docs/remote-cameras.md).")
    p.add_argument("--config", type=Path, default=None,
                   help="the daemon's configuration, for keys_dir and authorized_keys_dir "
                        "(default: $STGCND_CONFIG, else /etc/stgcnd/stgcnd.toml if present)")
    actions = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a client key pair and authorize it")
    create.add_argument("name", help="the client's name (its files: NAME.key, NAME.key_secret)")
    create.add_argument("--cameras", nargs="+", default=[], metavar="ID",
                        help="the camera ids the key may use (default: any camera)")
    create.add_argument("--out", type=Path, default=Path("."),
                        help="where to write the pair, for the camera's machine (default: .)")
    actions.add_parser("list", help="the authorized keys and their cameras").add_argument(
        "--json", action="store_true", help="print JSON instead of a table")
    revoke = actions.add_parser("revoke", help="remove a client's key from the authorized "
                                               "directory")
    revoke.add_argument("name", help="the client's name, as `keys list` shows it")
    actions.add_parser("server", help="print the daemon's public key (for the cameras)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    authorized = authorized_dir(config)
    if args.keys_command == "create":
        return _create(args.name, args.cameras, args.out, authorized)
    if args.keys_command == "list":
        keys = sorted(load_authorized(authorized).values(), key=lambda k: k.name)
        if args.json:
            print(json.dumps([{"name": k.name, "public": k.public, "cameras": list(k.cameras)}
                              for k in keys], indent=2))
        elif not keys:
            print(f"no authorized keys in {authorized}")
        for k in keys if not args.json else []:
            print(f"{k.name:<24} {k.public}  {' '.join(k.cameras) or '(any camera)'}")
        return 0
    if args.keys_command == "revoke":
        path = authorized / f"{args.name}.key"
        if not path.is_file():
            raise UserError(f"no key named {args.name!r} in {authorized}; `stgcnd keys list` "
                            "shows the names")
        path.unlink()
        print(f"removed {path}; {RELOAD}: its connections' requests then get `forbidden`")
        return 0
    public = keys_dir(config) / f"{SERVER_NAME}.key"
    if not public.is_file():
        raise UserError(f"no server key at {public} yet: the daemon makes it on its first start "
                        "with curve on (a tcp endpoint other machines can reach, or curve = "
                        "\"on\")")
    server_public, _ = zmq.auth.load_certificate(str(public))
    print(server_public.decode())
    print(f"# file: {public} (copy it to the cameras: Client(server_key=...))")
    return 0


def _create(name: str, cameras: list[str], out: Path, authorized: Path) -> int:
    if not NAME.match(name) or name == SERVER_NAME:
        raise UserError(f"{name!r}: use letters, digits, '.', '_' or '-' (at most 64), not "
                        f"{SERVER_NAME!r}")
    bad = [c for c in cameras if not c or any(ch.isspace() or ch in "\"'" for ch in c)]
    if bad:
        raise UserError(f"camera id {bad[0]!r}: ids bound to a key cannot hold spaces or quotes")
    target = authorized / f"{name}.key"
    if target.exists() or (out / f"{name}.key_secret").exists():
        raise UserError(f"a key named {name!r} exists ({target} or {out}/{name}.key_secret); "
                        "choose another name or `stgcnd keys revoke` it first")
    out.mkdir(parents=True, exist_ok=True)
    authorized.mkdir(parents=True, exist_ok=True)
    metadata = {"cameras": " ".join(cameras)} if cameras else None
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # the secret is 0600 from the start
        public, secret = zmq.auth.create_certificates(tmp, name, metadata=metadata)
        Path(secret).chmod(0o600)
        if cameras:  # pyzmq writes metadata into the secret file only; the daemon reads .key
            text = Path(public).read_text()
            Path(public).write_text(text.replace("metadata\n", "metadata\n    cameras = "
                                                 f"\"{' '.join(cameras)}\"\n", 1))
        shutil.copyfile(public, target)
        target.chmod(0o644)  # the daemon's user reads it
        for made in (public, secret):
            Path(made).replace(out / Path(made).name)
    print(f"authorized {target} ({' '.join(cameras) or 'any camera'}); {RELOAD}")
    print(f"camera's pair: {out / (name + '.key_secret')} (copy it to the camera's machine "
          "only; `stgcnd keys server` prints the daemon's key it also needs)")
    return 0
