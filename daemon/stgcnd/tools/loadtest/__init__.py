"""`stgcnd loadtest`: drive a daemon with P processes x K simulated cameras and measure it.

Our perf_analyzer. Each camera is a thread with its own `stgcnd_client.Client`, sending
synthetic skeletons in window or push mode, either open loop (a fixed schedule at a rate, with
latency measured from the scheduled send time so a slow server cannot hide its queueing: no
coordinated omission) or closed loop (the next request as soon as the reply arrives). Cameras
may join mid-run. The parent process merges every camera's raw per-request records and reports
windows/s, round-trip percentiles, the server's own timings, overhead, errors and the daemon's
CPU time per request.

Modules: `plan` (options, checked; which camera runs where), `camera` (one camera's loop and
its records), `worker` (one load process), `runner` (processes, start sync, daemon samples),
`daemon_cpu` (the daemon's CPU per request), `serve` (`--serve`: a daemon of our own), `stats`
(percentiles over merged records), `report` (the JSON report and its table), `scenarios` (named
loads and their goals), `echo_floor` (the bare ZeroMQ floor the goals are judged against).

The hot path imports only stgcnd_client, numpy, msgpack and pyzmq (plus the torch-free
`stgcnd.model.synthetic` when building data, before the clock starts): never torch, never the
daemon's server package.
"""
