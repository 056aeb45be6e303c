"""The agent side: ``Ledger`` and ``SyncLedger``, the executor of the per-call plan, receipts,
erasure and the embedded runner, over ``store`` (the SQLite file) and ``kafka`` (relay, claims,
lookups). May import ``core``, ``targets``, ``streams``, ``metrics``; never ``processors`` or an app."""
