"""Tools beside the daemon: the doctor, the generated docs, benchmarks, load tests, trtexec
runs, the demo, log summaries.

They use the daemon's packages (the runners it serves with, its client, its config); nothing
in the daemon imports them (tests/test_layers.py checks it).

`COMMANDS` is how `stgcnd` finds the tools' commands: its command line imports this package
by name, where installed, and reads the table; it names none of the modules. A new tool
command is a module in `commands/` with `register(subparsers)` and one line here.
"""

from __future__ import annotations

# command -> (its module, the command it follows in `stgcnd --help`: the daemon's or a tool's).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("stgcnd_tools.commands.demo", "config"),
    "camera-sim": ("stgcnd_tools.commands.camera_sim", "demo"),
    "loadtest": ("stgcnd_tools.commands.loadtest", "camera-sim"),
    "example": ("stgcnd_tools.commands.example", "loadtest"),
    "docs": ("stgcnd_tools.commands.docs", "example"),
    "bench": ("stgcnd_tools.commands.bench", "engines"),
    "doctor": ("stgcnd_tools.commands.doctor", "bench"),
    "tegrastats": ("stgcnd_tools.commands.tegrastats", "doctor"),
    "logs": ("stgcnd_tools.commands.logs", "tegrastats"),
    "trtexec": ("stgcnd_tools.commands.trtexec", "keys"),
}
