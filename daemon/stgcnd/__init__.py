"""stgcnd: an on-device inference daemon for two-stream ST-GCN action recognition."""

__version__ = "0.1.0"
