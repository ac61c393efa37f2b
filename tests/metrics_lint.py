"""Lint of a Prometheus exposition: ``promtool check metrics`` when it is installed, and always
the same rules in Python (what promtool's linter checks that matters here).

Rules: the text parses (prometheus_client's parser); every family has help text; names and
label names are snake_case; a counter's samples end in ``_total`` and nothing else does; no
family is declared twice; names use base units (``_seconds``, ``_bytes``), not abbreviations
or multiples (``_ms``, ``_milliseconds``, ``_kb`` …); no type name inside a metric name.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["lint", "parse_samples", "promtool_problems"]

_SNAKE = re.compile(r"^[a-z_:][a-z0-9_:]*$")
_LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
# promtool (client_golang's promlint): abbreviated units and non-base units.
_ABBREVIATIONS = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
_NON_BASE = {"milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "weeks", "kilobytes",
             "megabytes", "gigabytes", "terabytes", "petabytes", "kilometers", "celsius", "fahrenheit", "percent"}
_TYPE_WORDS = {"counter", "gauge", "histogram", "summary"}


def promtool_problems(exposition: str) -> list[str] | None:
    """What ``promtool check metrics`` reports (an empty list: clean); None when promtool is missing."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    done = subprocess.run([promtool, "check", "metrics"], input=exposition.encode(), capture_output=True,
                          timeout=60, check=False)
    output = (done.stdout + done.stderr).decode().strip()
    return [line for line in output.splitlines() if line.strip()] if done.returncode != 0 or output else []


def lint(exposition: str) -> list[str]:
    """The rules above in Python; an empty list when clean."""
    problems: list[str] = []
    declared: dict[str, str] = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in declared:
                problems.append(f"{name}: declared twice")
            declared[name] = kind
    helped = {parts[2] for line in exposition.splitlines()
              if line.startswith("# HELP ") and len(parts := line.split(" ", 3)) == 4 and parts[3].strip()}
    for name, kind in declared.items():
        if name not in helped:
            problems.append(f"{name}: no help text")
        if not _SNAKE.match(name):
            problems.append(f"{name}: not snake_case")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: a counter's name must end in _total")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{name}: only counters end in _total")
        parts = set(name.split("_"))
        for part in parts & _ABBREVIATIONS:
            problems.append(f"{name}: abbreviated unit {part!r}; use base units (seconds, bytes)")
        for part in parts & _NON_BASE:
            problems.append(f"{name}: {part!r} is not a base unit (seconds, bytes, ratio)")
        for part in parts & _TYPE_WORDS:
            problems.append(f"{name}: the metric type {part!r} in its name")
    try:
        families = list(text_string_to_metric_families(exposition))
    except ValueError as exc:
        return [*problems, f"does not parse: {exc}"]
    for family in families:
        for sample in family.samples:
            for label in sample.labels:
                if not _LABEL.match(label):
                    problems.append(f"{sample.name}: label {label!r} is not snake_case")
    return problems


def parse_samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample as ``{(name, labels): value}``."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition) for sample in family.samples}
