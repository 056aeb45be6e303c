"""The client side of effect-ledger: the event model, the pure effect state machine, the Avro codec,
topic administration, the producer SDK (``Ledger``) and its local store."""
