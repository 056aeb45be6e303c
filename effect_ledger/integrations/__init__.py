"""Integrations with workflow engines (LangGraph, DBOS) over one shared wrapper. Each module imports
its engine, an extra (``[langgraph]`` / ``[dbos]``). May import ``sdk``, ``core``; no other app."""
