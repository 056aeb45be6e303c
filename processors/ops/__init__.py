"""Operator and auditor tools: replay audit, trace, stuck, tail, escalations, the SQL sink."""
