"""``effects mcp-proxy``: an MCP proxy that records each call of a declared write tool as an effect."""
