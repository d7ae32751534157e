"""`stgcnd doctor`'s checks: the board, the GPU stack and the systemd unit, each with its fix."""
