"""Serving MCP over streamable HTTP, in one process or several.

- ``sockets``: the listening address: whether a port is free, the address family, uvicorn's
  speed-ups and its start-up failure status (no imports of the other modules here);
- ``app``: the ASGI application, built in this process or in each HTTP worker;
- ``http``: ``serve_http``, the entry ``kernelarc serve --transport http`` calls;
- ``workers``: several HTTP worker processes behind one dispatching process.

The dependencies point one way: ``http`` -> ``app``, ``workers`` -> ``sockets``.
"""
