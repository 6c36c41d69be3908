"""The agent interface: one tool set (``tools``), served over MCP (``mcp_server``) and driven by
our own Anthropic tool-use loop (``driver``); ``files`` confines an agent's file access.

Nothing here imports torch; ``mcp`` and ``anthropic`` are imported only by the modules that
serve or drive, so ``import orchestrator.cli`` stays light.
"""
