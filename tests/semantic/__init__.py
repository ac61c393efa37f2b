"""Semantic discovery (the semantic package)."""
