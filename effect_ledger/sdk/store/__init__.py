"""The ledger file: SQLite tables (the one DDL), the store that writes them, a read-only reader, and
retirement in the file. May import ``core`` and ``streams``; nothing else of the SDK."""
