"""The documentation's generated parts (`stgcnd docs`) and the configuration's annotated example
and key table (`stgcnd config example|keys`), made from the daemon's schema and the client's
codes."""
