"""``python -m guard.problems.kernelbench_probe``: answer probe requests on stdin."""

from .serving import serve

serve()
