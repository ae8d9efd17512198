"""Memory shared by the agents: verified conclusions (``conclusions``), each agent's
trajectory (``trajectory``), and recall over both plus the playbooks (``recall``)."""
