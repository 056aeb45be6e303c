"""The services that fold the stream (``effect_ledger.processors``): the faust ledger processor and
the reconciliation consumers. May import ``core``, ``streams``, ``targets``, ``sdk``; faust's private
parts only through ``_faust_internals``."""
