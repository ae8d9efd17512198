"""Swarm launcher: agents' clones and confinement, agent clients, monitoring and reports. The strategy prompts
it assigns live with the playbooks (``playbooks/strategies/*.md``)."""
