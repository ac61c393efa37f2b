"""Convert a public tool-retrieval benchmark into an evaluation set: BFCL's labelled questions.

The Berkeley Function Calling Leaderboard (``bfcl-eval`` on PyPI, Apache-2.0; nobody on this
project wrote it) ships function definitions — a name, a description, typed parameters — and
user questions, each labelled with the function that answers it. As a search set: every distinct
function is an agent with one capability (its description; its parameters as tags), every
question a query labelled with that function's agent. ``simple_python`` gives one function per
question, ``multiple`` two to four (the others are the distractors BFCL chose), all pooled, so a
question competes with every function of both files.

Run once to (re)write ``tests/data/semantic_eval_bfcl.json`` from a downloaded wheel or an
unpacked ``bfcl_eval/data`` directory (the set is committed, so nothing here runs at test time)::

    .venv/bin/pip download --no-deps -d /tmp/bfcl bfcl-eval
    .venv/bin/python -m bench.semantic_public /tmp/bfcl/bfcl_eval-*.whl

The set only reports (``bench.semantic``): no weight, blend or threshold is chosen on it.
"""

from __future__ import annotations

import argparse
import json
import re
import zipfile
from pathlib import Path

from semantic.evaluation import EvalSet, load_eval_set

_ROOT = Path(__file__).resolve().parent.parent
OUTPUT = _ROOT / "tests" / "data" / "semantic_eval_bfcl.json"
SOURCES = ("simple_python", "multiple")
_SLUG = re.compile(r"[^a-z0-9]+")


def _read(source: Path, name: str) -> list[dict[str, object]]:
    """The JSON lines of ``bfcl_eval/data/<name>`` from a wheel or a data directory."""
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            text = wheel.read(f"bfcl_eval/data/{name}").decode("utf-8")
    else:
        text = (source / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _slug(name: str) -> str:
    return _SLUG.sub("_", name.lower()).strip("_")[:60] or "function"


def convert(source: Path, version: str) -> EvalSet:
    """The evaluation set of :data:`SOURCES` read from ``source``."""
    agents: dict[str, dict[str, object]] = {}  # function name -> agent
    queries: list[dict[str, object]] = []
    taken: set[str] = set()
    for part in SOURCES:
        answers = {row["id"]: row["ground_truth"] for row in _read(source, f"possible_answer/BFCL_v4_{part}.json")}
        for row in _read(source, f"BFCL_v4_{part}.json"):
            for function in row["function"]:  # type: ignore[union-attr]
                name = function["name"]
                if name in agents:
                    continue  # the same function in several questions: one agent (its first text)
                slug = _slug(name)
                agent_id = f"bfcl.{part.replace('_', '-')}.{slug}"
                number = 1
                while agent_id in taken:
                    number += 1
                    agent_id = f"bfcl.{part.replace('_', '-')}.{slug}_{number}"
                taken.add(agent_id)
                parameters = tuple(function.get("parameters", {}).get("properties", {}))
                agents[name] = {"agent_id": agent_id, "display_name": name, "description": function["description"],
                                "capabilities": [{"name": name, "version": "1", "description": function["description"],
                                                  "tags": list(parameters)}]}
            (expected,) = answers[row["id"]][0].keys()  # type: ignore[index]
            question = row["question"][0][-1]["content"]  # type: ignore[index]
            queries.append({"query": question, "agent_id": agents[expected]["agent_id"], "capability": expected})
    about = (f"Public tool-retrieval set converted by bench/semantic_public.py from the Berkeley Function Calling "
             f"Leaderboard (bfcl-eval {version}, Apache-2.0, files BFCL_v4_{{{','.join(SOURCES)}}}.json and their "
             f"possible answers): every distinct function is an agent with one capability, its parameters as tags; "
             f"every question is a query labelled with the function of its ground truth. Nobody on this project "
             f"wrote it. Report-only: nothing is tuned on it.")
    return EvalSet.model_validate({"about": about, "agents": list(agents.values()), "queries": queries})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a bfcl_eval wheel, or its bfcl_eval/data directory")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    arguments = parser.parse_args()
    match = re.search(r"bfcl_eval-([^-]+)-", arguments.source.name)
    eval_set = convert(arguments.source, match.group(1) if match else "unknown version")
    arguments.output.write_text(json.dumps(eval_set.model_dump(), ensure_ascii=False, indent=1) + "\n",
                                encoding="utf-8")
    load_eval_set(arguments.output)
    print(f"{arguments.output}: {len(eval_set.agents)} agents, {len(eval_set.queries)} queries")


if __name__ == "__main__":
    main()
