"""Tools: MCP sessions and transports, the ledger of tool effects, the tools' policy, the fetch server."""
