"""The agent side of Kafka mode: the relay of the outbox, claims decided by the log, lookups to the
processor and the keys topic of erasable bodies. May import ``sdk.store``, ``core``, ``targets``,
``streams``."""
