"""Integrations with workflow engines (LangGraph, DBOS). Each module imports its engine, which is an
extra (``pip install effect-ledger-kafka[langgraph]`` / ``[dbos]``): the core never imports them."""
