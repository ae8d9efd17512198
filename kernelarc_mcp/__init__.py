"""KernelArc MCP: the command line, the MCP server and configuration."""

__version__ = "0.1.0"
