"""Topology, the CLI and the processes it runs (the topology package)."""
