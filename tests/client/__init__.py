"""The agent SDK."""
