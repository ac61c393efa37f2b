"""Federation (the federation package)."""
