"""Prometheus metrics: every name exported (``names``) and the ``/metrics`` endpoint (``http``).
May import ``streams.config`` and ``errors``."""
