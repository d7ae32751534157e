"""`stgcnd loadtest`: drive a daemon with P processes x K simulated cameras and measure it.

Our perf_analyzer: open loop (latency from the scheduled send: no coordinated omission) or
closed loop, window or push mode; the parent merges every camera's records into one report.
The hot path never imports torch or the daemon's server package.
"""
