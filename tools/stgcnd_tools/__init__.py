"""Tools beside the daemon: benchmarks, load tests, trtexec runs, the demo, log summaries.

They use the daemon's packages (the runners it serves with, its client, its config); nothing
in the daemon imports them (tests/test_layers.py checks it).
"""
