"""Turning the daemon's JSON logs into tables and plots (`stgcnd logs`)."""
