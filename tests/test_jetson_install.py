"""docs/jetson.md's install steps work as written, for a normal user, in a fresh venv.

The doc marks its blocks as README.md does (tests/test_readme.py): `<!-- not-run: why -->` before
what needs a Jetson, root or systemd, and two blocks that this file runs:

  <!-- ci: install-as-root ... -->  the one root step that CI can take: the directory the venv
                                     goes in, made and handed to the user who will run pip;
  <!-- ci: install-as-user ... -->  the venv and pip steps, which must need no root at all.

What the slow test proves, on any Linux with Python 3.8 or later. As an unprivileged user
(`nobody`, uid 65534, switched to with setpriv or runuser when the suite runs as root; the
suite's own user when it does not) and with `bash -e`, so that a failing step fails the test:
the root block, run as root with `$USER` naming that user (without root: the same directory,
made by that user), gives a directory the user can write; then every line of the user block
succeeds in a copy of the checkout owned by that user (as a clone on the board is): a venv made
with `python3 -m venv --system-site-packages`, pip upgraded in it, the constraints file written,
stgcnd installed from the checkout with the constraints (not editable), `stgcnd --version`. Then,
as that user, `stgcnd config example` and `stgcnd config check` of that example (which loads the
configuration through msgspec, as `stgcnd serve` does), stgcnd imported from the venv and not
from the checkout, the installed versions of the pins that apply to this Python, and every file
under the venv's directory owned by that user. The old doc's `sudo python3 -m venv` followed by
a plain `pip install` fails here (pip: Permission denied), and so would any step that writes
outside the user's own directories.

What it does not prove: anything about JetPack or aarch64. Two substitutions: /opt/stgcnd becomes
a temporary directory, and `python3` is an interpreter the user can run (the base interpreter of
the suite's own Python where the user can run it, else the system's `python3`, which is what the
board uses too). The apt step, TensorRT and its bindings through --system-site-packages, CUDA,
the GPU and systemd are not exercised, and the pins for JetPack's Pythons (3.8 and 3.10) are
installed only when that interpreter is that version. The offline tests check the pins against
pyproject.toml and the doc's table; with TEST_NET=1, each JetPack's pinned set is resolved for
aarch64 with its dependencies (`pip download --only-binary=:all:`).

Network: pip uses the index it is configured with (the PIP_* variables and the system's pip.conf
are passed on, a user's ~/.config/pip is not). Where pip cannot fetch stgcnd's dependencies (a
probe download fails), the test runs offline: PIP_NO_INDEX=1, build isolation off, and the
suite's own site-packages on PYTHONPATH, so that the dependencies installed there satisfy pip.
That needs the interpreter to be the suite's Python version; otherwise the test fails and says
so. Offline, the pins are not installed and the check of their versions is left out.
TEST_OFFLINE=1 forces offline mode.

The test is skipped (not failed) only where it runs as root and cannot switch to an
unprivileged user.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_readme import commands, stgcnd_argv

DOC = REPO / "docs" / "jetson.md"
BLOCK = re.compile(r"^<!-- (ci|run|not-run)(?::([^>]*))? -->\n```(\w+)\n(.*?)^```", re.M | re.S)
OPT = "/opt/stgcnd"
JETPACK_PYTHONS = {"3.8": "JetPack 5.1.2", "3.10": "JetPack 6.x"}
NOBODY = 65534


@dataclass(frozen=True)
class Block:
    kind: str
    label: str
    lang: str
    code: str


def install_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Install")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def blocks() -> list[Block]:
    return [Block(kind, (label or "").strip(), lang, code)
            for kind, label, lang, code in BLOCK.findall(install_section())]


def ci_block(name: str) -> str:
    found = [b.code for b in blocks() if b.kind == "ci" and b.label.split(";")[0] == name]
    assert len(found) == 1, f"docs/jetson.md needs one block marked <!-- ci: {name} -->"
    return found[0]


def constraints_text() -> str:
    """The constraints file the user block writes (its here-document)."""
    m = re.search(r"<<'EOF'\n(.*?)^EOF$", ci_block("install-as-user"), re.M | re.S)
    assert m, "the install-as-user block no longer writes the constraints file"
    return m.group(1)


def pins(python: str) -> dict[str, str]:
    """name -> pinned version of the constraints that apply to `python` (on aarch64 Linux)."""
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": f"{python}.0",
           "platform_machine": "aarch64", "sys_platform": "linux", "platform_system": "Linux",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython"}
    out = {}
    for line in constraints_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            (spec,) = req.specifier
            assert spec.operator == "==", line
            out[canonical(req.name)] = spec.version
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def applying_requirements(python: str) -> dict[str, str]:
    """name -> requirement (marker dropped) of stgcnd's core and onnxruntime extra that apply
    to `python` on aarch64 Linux (pyproject.toml's markers evaluated for it)."""
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    env = {"python_version": python, "python_full_version": f"{python}.0",
           "platform_machine": "aarch64", "sys_platform": "linux", "platform_system": "Linux",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    out = {}
    for line in [*project["dependencies"],
                 *project["optional-dependencies"]["onnxruntime"]]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out[canonical(req.name)] = f"{req.name}{req.specifier}"
    return out


# --- offline checks of the doc ----------------------------------------------------------------

def test_install_blocks_are_marked_and_the_user_block_needs_no_root():
    section = install_section()
    fences = len(re.findall(r"^```", section, re.M))
    assert fences % 2 == 0 and len(blocks()) == fences // 2, \
        "a fenced block in docs/jetson.md's Install section has no <!-- ci/not-run --> marker"
    root, user = ci_block("install-as-root"), ci_block("install-as-user")
    assert all(line.startswith("sudo ") for line in commands(root)), root
    assert OPT in root and OPT in user
    assert "sudo" not in user, "the user's install steps must not need root"
    assert "python3 -m venv --system-site-packages" in user, \
        "JetPack's tensorrt is found only through --system-site-packages"
    assert not re.search(r"pip install[^\n]*\s-e\s", user), \
        "an editable install leaves code in the home directory, which the unit cannot see"
    assert "pycuda" not in section


@pytest.mark.parametrize("block", [b for b in blocks() if b.lang == "bash"],
                         ids=lambda b: commands(b.code)[0][:40])
def test_install_blocks_parse_and_their_stgcnd_commands_too(block):
    r = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from stgcnd.cli import build_parser

    for line in commands(block.code):
        for argv in stgcnd_argv(line.replace(f"{OPT}/venv/bin/stgcnd", "stgcnd")):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:  # --version exits 0 after printing
                if exc.code != 0:
                    pytest.fail(f"docs/jetson.md: `stgcnd {' '.join(argv)}` does not "
                                f"parse (exit {exc.code})")
        for word in line.split():
            if word.startswith(("systemd/", "docs/")):
                assert (REPO / word).exists(), f"docs/jetson.md names {word}, which does not exist"


def test_the_unit_runs_the_documented_venv():
    unit = (REPO / "systemd" / "stgcnd.service").read_text()
    assert f"ExecStart={OPT}/venv/bin/stgcnd serve" in unit
    assert "ProtectHome=yes" in unit  # why the doc says: not editable


def install_commands() -> list[str]:
    """Every command line of the Install section's shell blocks, in the doc's order."""
    return [line for b in blocks() if b.lang == "bash" for line in commands(b.code)]


@pytest.mark.parametrize("release", ["r35.4.1", "r36.4.3"])
def test_the_unit_is_installed_and_checked_before_the_first_start(tmp_path, stgcnd_main,
                                                                  release):
    """install -> unit -> doctor -> start (issue #43): a device node, group or address the
    unit lacks is found by `stgcnd doctor` before `auto` serves on the CPU under it. And the
    doctor of step 6, on the root file system the steps before it leave (the groups and user
    that step 4 makes, the unit where it installs it) and with the configuration the unit
    reads, passes its unit checks on JetPack 5 and 6."""
    lines = install_commands()

    def first(what: str, *words: str) -> int:
        found = [i for i, line in enumerate(lines) if all(w in line for w in words)]
        assert found, f"docs/jetson.md's Install section has no command for {what}"
        return found[0]

    venv = first("the venv", "python3 -m venv")
    group = first("a missing render group", "groupadd --system render")
    user = first("the service's user", "useradd")
    config = first("the configuration", "install", "/etc/stgcnd/stgcnd.toml")
    unit = first("the unit", "install", "systemd/stgcnd.service", "/etc/systemd/system/")
    doctor = first("doctor", f"{OPT}/venv/bin/stgcnd doctor")
    start = first("the first start", "systemctl enable --now stgcnd")
    assert venv < group < user < unit < doctor < start and config < doctor, lines
    assert "--config /etc/stgcnd/stgcnd.toml" in lines[doctor]
    exec_start = next(line for line in (REPO / "systemd" / "stgcnd.service").read_text()
                      .splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith("--config /etc/stgcnd/stgcnd.toml"), exec_start
    assert "216/GROUP" in DOC.read_text()

    # The root file system as steps 1-4 leave it.
    root = tmp_path / "root"
    for d in ("etc/systemd/system", "proc/device-tree"):
        (root / d).mkdir(parents=True)
    shutil.copy(REPO / "tests" / "commands" / "data" / f"nv_tegra_release.{release}",
                root / "etc" / "nv_tegra_release")
    (root / "proc" / "device-tree" / "model").write_text("NVIDIA Orin NX Developer Kit\x00")
    words = lines[user].split()
    name, groups = words[-1], words[words.index("--groups") + 1].split(",")
    (root / "etc" / "passwd").write_text(f"root:x:0:0::/root:/bin/bash\n{name}:x:998:998::/:/x\n")
    (root / "etc" / "group").write_text("".join(f"{g}:x:{100 + i}:\n" for i, g in
                                                enumerate(["root", *groups, name])))
    shutil.copy(REPO / "systemd" / "stgcnd.service", root / lines[unit].split()[-1].lstrip("/"))
    r = stgcnd_main("doctor", "--json", "--root", str(root), "--config",
                    str(REPO / "systemd" / "stgcnd.toml"))
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    unit_checks = {k: v["status"] for k, v in checks.items() if k.startswith("unit")}
    assert unit_checks == {"unit: device nodes": "ok", "unit: user and groups": "ok",
                           "unit: address filter": "ok"}, checks
    assert r.returncode == 0


@pytest.mark.parametrize("python", sorted(JETPACK_PYTHONS))
def test_pins_satisfy_pyproject_and_match_the_doc_table(python):
    from packaging.requirements import Requirement

    pinned, wanted = pins(python), applying_requirements(python)
    assert pinned, f"no pins for Python {python} ({JETPACK_PYTHONS[python]})"
    for name, version in pinned.items():
        assert name in wanted, f"{name} is pinned for {python} but is not a dependency there"
        assert Requirement(wanted[name]).specifier.contains(version, prereleases=True), \
            f"{name}=={version} for Python {python} is outside pyproject's {wanted[name]}"
    for name in ("numpy", "onnx", "onnxruntime", "msgspec", "pyzmq"):  # compiled: aarch64 wheels
        assert name in pinned, f"{name} is not pinned for Python {python}"
    if python == "3.10":
        assert int(pinned["numpy"].split(".")[0]) < 2, "JetPack 6: numpy 1 (see the doc)"
    # The table "What each JetPack gets": column 1 is JetPack 5 (3.8), 2 and 3 JetPack 6 (3.10).
    columns = (1,) if python == "3.8" else (2, 3)
    table = {}
    for row in re.findall(r"^\| ([\w-]+)(?: \([^)]*\))? \|(.*)\|$", install_section(), re.M):
        table[canonical(row[0])] = [cell.strip() for cell in row[1].split("|")]
    for name in set(pinned) | {n for n in table if n in wanted}:
        assert name in table, f"the doc's table has no row for the pinned {name}"
        for column in columns:
            cell = table[name][column - 1]
            assert cell == pinned.get(name, "(any)"), \
                f"docs/jetson.md's table says {name} {cell} for Python {python}, " \
                f"the constraints {pinned.get(name, 'no pin')}"


@pytest.mark.skipif(os.environ.get("TEST_NET") != "1",
                    reason="downloads about 150 MB from the package index; set TEST_NET=1")
@pytest.mark.parametrize("python", sorted(JETPACK_PYTHONS))
def test_each_pinned_set_resolves_to_aarch64_wheels(python, tmp_path):
    """pip evaluates a constraint's marker for the Python it runs on, so they are given here
    already evaluated for the target."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins(python).items()))
    wanted = [r for n, r in applying_requirements(python).items() if n not in ("torch",
                                                                                "tensorrt")]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
         "--python-version", python, "--platform", "manylinux2014_aarch64",
         "--platform", "manylinux_2_28_aarch64", "--only-binary=:all:",
         "-c", str(constraints), "-d", str(tmp_path / "wheels"), *wanted],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {canonical(p.name.split("-")[0]): p.name.split("-")[1]
           for p in (tmp_path / "wheels").glob("*.whl")}
    for name, version in pins(python).items():
        assert got.get(name) == version, (name, version, sorted(got.items()))


# --- the slow test: the documented steps, run as an unprivileged user ---------------------------

@dataclass
class User:
    prefix: list[str]   # what runs a command as the user (empty: we are that user)
    uid: int
    gid: int
    name: str


def unprivileged_user() -> User | None:
    """The user to install as, or None where the suite runs as root and cannot switch."""
    if os.geteuid() != 0:
        return User([], os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name)
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
    except KeyError:
        uid, gid, name = NOBODY, NOBODY, str(NOBODY)
    candidates = []
    if shutil.which("setpriv"):
        candidates.append([shutil.which("setpriv"), f"--reuid={uid}", f"--regid={gid}",
                           "--clear-groups", "--"])
    if shutil.which("runuser") and name != str(uid):
        candidates.append([shutil.which("runuser"), "-u", name, "--"])
    for prefix in candidates:
        try:
            r = subprocess.run([*prefix, "id", "-u"], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if r.returncode == 0 and r.stdout.strip() == str(uid):
            return User(prefix, uid, gid, name)
    return None


def run_as(user: User, cmd: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    """`cmd` as `user` with exactly `env` (switching tools may change the environment)."""
    return subprocess.run([*user.prefix, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                           *cmd], capture_output=True, text=True, **kw)


def passed_on_environment() -> dict[str, str]:
    """pip's configuration, proxies and certificates: what reaching the index needs."""
    keep = re.compile(r"^(PIP_\w+|https?_proxy|no_proxy|all_proxy|SSL_CERT_\w+|"
                      r"REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)$", re.I)
    return {k: v for k, v in os.environ.items() if keep.match(k)}


def interpreter_for(user: User, env: dict[str, str]) -> str | None:
    """A Python >= 3.8 with venv and ensurepip that `user` can run: the suite's base interpreter,
    else the system's python3."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    here = [getattr(sys, "_base_executable", None),
            str(Path(sys.base_prefix) / "bin" / f"python{minor}")]
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    seen = []
    for candidate in [*here, system]:
        if not candidate or candidate in seen or not Path(candidate).exists():
            continue
        seen.append(candidate)
        r = run_as(user, [candidate, "-c", "import sys, venv, ensurepip; "
                          "assert sys.version_info >= (3, 8)"], env, timeout=60)
        if r.returncode == 0:
            return candidate
    return None


def python_version(user: User, python: str, env: dict[str, str]) -> str:
    r = run_as(user, [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], env,
               timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def copy_checkout(dest: Path) -> None:
    """The checkout's files as they are (tracked and untracked ones git does not ignore)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                  "--exclude-standard"], cwd=REPO, capture_output=True,
                                 check=True, timeout=60).stdout.decode()
        paths = [p for p in listing.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
    if not paths:  # not a git checkout: everything but what is built or cached
        shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv*", "engines", "__pycache__", "*.egg-info", "build", ".pytest_cache"))
        return
    for rel in paths:
        src = REPO / rel
        if not (src.is_file() or src.is_symlink()):
            continue  # deleted in the working tree, or a submodule
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def pip_can_fetch(env: dict[str, str], scratch: Path) -> bool:
    """Whether pip, configured as for the user, can download one of stgcnd's dependencies."""
    if os.environ.get("TEST_OFFLINE") == "1":
        return False
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                        "--no-cache-dir", "--no-deps", "--only-binary=:all:", "--retries", "0",
                        "--timeout", "20", "-d", str(scratch / "wheels"), "msgspec"],
                       capture_output=True, text=True, timeout=300,
                       env={**env, "HOME": str(scratch), "PATH": os.environ.get("PATH", "")})
    return r.returncode == 0


def work_directory(user: User) -> Path:
    """A fresh directory that `user` can reach: in the temporary directory, else /var/tmp or
    /dev/shm (a /tmp of mode 0700 has been seen on the development machine)."""
    for base in dict.fromkeys([tempfile.gettempdir(), "/var/tmp", "/dev/shm"]):
        if not os.path.isdir(base):
            continue
        work = Path(tempfile.mkdtemp(prefix="stgcnd-jetson-install-", dir=base))
        work.chmod(0o755)
        if run_as(user, ["ls", str(work)], {"PATH": "/usr/bin:/bin"}, timeout=30).returncode == 0:
            return work
        shutil.rmtree(work, ignore_errors=True)
    pytest.fail("no temporary directory that an unprivileged user can reach")


CHECK_PINS = """
import importlib.metadata, sys
from pip._vendor.packaging.requirements import Requirement
wrong = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line and not line.startswith("#"):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            (spec,) = req.specifier
            got = importlib.metadata.version(req.name)
            if got != spec.version:
                wrong.append(f"{req.name}: {got}, pinned {spec.version}")
print("\\n".join(wrong) or "pins ok")
sys.exit(1 if wrong else 0)
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_documented_install_runs_as_an_unprivileged_user():
    user = unprivileged_user()
    if user is None:
        pytest.skip("running as root without setpriv or runuser to become an unprivileged user")
    root_block, user_block = ci_block("install-as-root"), ci_block("install-as-user")
    work = work_directory(user)
    try:
        home, tmp, bin_dir, src, opt = (work / d for d in ("home", "tmp", "bin", "src", "opt"))
        for d in (home, tmp, bin_dir, src, opt):
            d.mkdir(mode=0o755)
        copy_checkout(src)
        for d in (home, tmp, src):
            chown_tree(d, user.uid, user.gid)
        venv_dir = opt / "stgcnd"
        env = {"HOME": str(home), "USER": user.name, "LOGNAME": user.name, "LANG": "C.UTF-8",
               "TMPDIR": str(tmp), "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
               **passed_on_environment()}

        # Step 2, the directory: as root where we are root, with $USER naming the user.
        if os.geteuid() == 0:
            script = root_block.replace(OPT, str(venv_dir)).replace("sudo ", "")
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-x", "-c", script],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, f"the documented root step failed:\n{r.stderr}"
        else:
            venv_dir.mkdir(mode=0o755)
        st = venv_dir.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o755), \
            f"the root step left {venv_dir} owned by {st.st_uid}, mode {st.st_mode & 0o777:o}"

        python = interpreter_for(user, env)
        assert python, ("no Python >= 3.8 with venv and ensurepip that an unprivileged user can "
                        f"run (tried the suite's {sys.base_prefix} and the system's python3)")
        (bin_dir / "python3").symlink_to(python)
        version = python_version(user, python, env)

        with tempfile.TemporaryDirectory() as scratch:
            online = pip_can_fetch(env, Path(scratch))
        if not online:
            here = f"{sys.version_info[0]}.{sys.version_info[1]}"
            assert version == here, (
                f"offline (pip cannot fetch from its index), and the user's Python {version} "
                f"({python}) cannot use this suite's Python {here} packages")
            env.update({"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
                        "PYTHONPATH": os.pathsep.join(dict.fromkeys(
                            sysconfig.get_paths()[k] for k in ("purelib", "platlib")))})

        script = work / "install-as-user.sh"
        script.write_text(user_block.replace(OPT, str(venv_dir)))
        script.chmod(0o644)
        r = run_as(user, ["bash", "-e", "-o", "pipefail", "-x", str(script)], env, cwd=src,
                   timeout=1500)
        assert r.returncode == 0, (
            f"a documented install step failed as {user.name} (uid {user.uid}) with {python} "
            f"(Python {version}, {'online' if online else 'offline'}):\n"
            f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}")

        venv = venv_dir / "venv"
        stgcnd = str(venv / "bin" / "stgcnd")
        expected = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(),
                             re.M).group(1)
        r = run_as(user, [stgcnd, "--version"], env, cwd=home, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == f"stgcnd {expected}", r.stdout + r.stderr

        r = run_as(user, [stgcnd, "config", "example"], env, cwd=home, timeout=120)
        assert r.returncode == 0 and "[server]" in r.stdout and "[[models]]" in r.stdout, r.stderr
        # `config check` checks that the files it names exist: the example's checkpoint
        # (/var/lib/stgcnd/models/...) stands here beside the file.
        checkpoint = tmp / "epoch60_model.pt"
        checkpoint.write_bytes(b"")
        checkpoint.chmod(0o644)
        example = tmp / "stgcnd.toml"
        example.write_text(r.stdout.replace("/var/lib/stgcnd/models/epoch60_model.pt",
                                            str(checkpoint)))
        example.chmod(0o644)
        r = run_as(user, [stgcnd, "config", "check", str(example)], env, cwd=home, timeout=120)
        assert r.returncode == 0 and '"models"' in r.stdout, \
            f"`stgcnd config check` of the example failed in the installed venv:\n{r.stderr}"

        r = run_as(user, [str(venv / "bin" / "python"), "-c",
                          "import stgcnd; print(stgcnd.__file__)"], env, cwd=home, timeout=120)
        assert r.returncode == 0 and r.stdout.strip().startswith(str(venv)), \
            f"stgcnd is not imported from the venv: {r.stdout}{r.stderr}"

        if online:
            r = run_as(user, [str(venv / "bin" / "python"), "-c", CHECK_PINS,
                              str(venv_dir / "constraints.txt")], env, cwd=home, timeout=120)
            assert r.returncode == 0, f"installed versions differ from the pins:\n{r.stdout}"

        not_theirs = [str(p) for p in [venv_dir, *venv_dir.rglob("*")]
                      if p.lstat().st_uid != user.uid]
        assert not not_theirs, f"files under {venv_dir} not owned by {user.name}: {not_theirs[:5]}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
