"""The node's HTTP face."""
