"""Telling clients on this machine where the local cluster runs: ``agent-reach up`` writes its
nodes' URLs — the packaged ports, or the free ones it chose — to ``~/.agent-reach/local.json``
(:data:`node.client.LOCAL_CLUSTER_FILE`), with where its secret comes from and an admin token,
and takes the file away when it stops.

The SDK (:func:`node.client.default_node_url`) and the command line (``topology.cli.nodeurl``)
read it when neither ``--node``/``node_url`` nor ``$AGENT_REACH_URL`` names a node. The file is
written whole (a temporary file renamed over it) with mode 0600, since it holds an admin token;
it names the ``up`` process, so a file left behind by an ``up`` that was killed reads as stale,
and a second ``up`` that took the file over keeps it when the first one stops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from node.client import LOCAL_CLUSTER_FILE, LocalClusterFile

from ..errors import LauncherError

__all__ = ["published_cluster"]


@contextlib.contextmanager
def published_cluster(*, topology: str, nodes: Mapping[str, str], secret: str, admin_token: str,
                      path: Path | None = None) -> Iterator[Path]:
    """Write the cluster file for as long as the ``with`` block runs; yields its path.

    ``nodes`` maps each region to its node URL, the first region first (the clients' default).
    Raises :class:`LauncherError` when the file cannot be written (the directory is not writable).
    """
    if not nodes:
        raise ValueError("published_cluster needs at least one node")
    file = (path or LOCAL_CLUSTER_FILE).expanduser()
    written = LocalClusterFile(pid=os.getpid(), topology=topology, url=next(iter(nodes.values())),
                               nodes=dict(nodes), secret=secret, admin_token=admin_token)
    try:
        _write_private(file, written.model_dump_json(indent=2).encode() + b"\n")
    except OSError as exc:
        raise LauncherError(f"cannot write {file} for the clients on this machine: {exc}; make "
                            f"{file.parent} writable") from exc
    try:
        yield file
    finally:
        _remove_if_ours(file, written.pid)


def _write_private(file: Path, content: bytes) -> None:
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = file.with_name(f".{file.name}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as opened:
            opened.write(content)
        os.replace(partial, file)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def _remove_if_ours(file: Path, pid: int) -> None:
    """Remove ``file`` unless another ``up`` wrote it since (it names that one's pid)."""
    try:
        current = LocalClusterFile.model_validate_json(file.read_bytes())
    except (OSError, ValueError):  # gone, or not ours to judge
        return
    if current.pid == pid:
        with contextlib.suppress(OSError):
            file.unlink()
