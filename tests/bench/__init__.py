"""Benchmarks of effect-ledger against the real SQLite disk and the real Kafka broker.

    python -m tests.bench [--quick] [--only NAME ...] [--json bench-results.json] [--reps N]

(``make bench`` runs it under ``scripts/with-kafka.sh``.) Each benchmark is one function
``run(ctx) -> BenchResult`` in a module beside this one, listed in ``BENCHMARKS`` of
``tests/bench/__main__.py``; every figure is the median over repeated runs next to a raw limit
measured in the same run. The table is printed with rich and the results written as JSON. Timing
goals are reported here, never asserted in a test.
"""
