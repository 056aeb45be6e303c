"""Operator and auditor read models: replay audit, trace, stuck, tail, escalations, the SQL sink,
assess. May import ``sdk``, ``streams``, ``core``; no other app."""
