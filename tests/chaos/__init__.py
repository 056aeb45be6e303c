"""``make chaos``: a replicated cluster in network namespaces under a nemesis, and a checker
(``python -m tests.chaos --help``)."""
