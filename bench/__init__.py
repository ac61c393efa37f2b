"""Benchmarks that print numbers (never timed assertions in tests); run each from the repository
root as a module, ``.venv/bin/python -m bench.<name>`` (or ``make bench``)."""
