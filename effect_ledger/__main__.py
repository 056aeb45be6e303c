"""``python -m effect_ledger``: the ``effects`` command line."""

from effect_ledger.processors.cli import main

main()
