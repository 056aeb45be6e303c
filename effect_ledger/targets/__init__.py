"""Destinations: the targets declaration (``load``), asking a destination by key (``ask``) and the
built-in HTTP reconciler (``http``). May import ``core`` and ``errors``; never the SDK."""
