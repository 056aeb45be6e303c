"""``python -m effect_ledger``: the ``effects`` command line."""

from effect_ledger.cli.main import main

main()
