"""The soak (`make soak`): effect-ledger under steady load with kills and a broker restart."""
