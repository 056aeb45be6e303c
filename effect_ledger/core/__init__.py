"""The pure core: the event model, the key rule, limits, the fold, the per-call plan, reconciliation
verdicts, deadlines and retention. Imports the standard library and ``effect_ledger.errors`` only; no
I/O, and time is always an argument."""
