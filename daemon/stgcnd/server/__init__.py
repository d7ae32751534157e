"""The daemon: configuration, ZeroMQ transport, per-camera sessions, lifecycle."""
