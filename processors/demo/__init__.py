"""The refund story: a payment gateway on loopback, an agent that is killed after the call, and the
ledger that keeps the restart from paying twice."""
