"""The refund story: a gateway on loopback, an agent killed after the call, and the ledger that keeps
the restart from paying twice. May import ``sdk``, ``processors``, ``streams``, ``core``."""
