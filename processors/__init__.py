"""The services that fold the stream: the embedded runner, reconcilers, the demo and the ``effects``
command line."""
