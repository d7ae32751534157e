"""Simulated cameras and the newcomer's one-command demo."""
