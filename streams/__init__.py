"""The topics and what flows on them (``effect_ledger.streams``): topic config and admin, the Avro
codec, the registry framing and schemas topic, partitioning, watermarks, dead letters. May import
``core``, ``errors`` and ``schemas``; never the SDK, the processors or faust."""
