"""``effects mcp-proxy``: an MCP proxy that records each call of a declared write tool as an effect.
May import ``sdk``, ``core``, ``streams``; no other app."""
