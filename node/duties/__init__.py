"""What one replica of a region does for all: leadership, the lease sweeper and the prober, and
their settings (``DutySettings``).
"""

from .leader import LeaderLease, Leadership, new_node_id
from .prober import Prober
from .settings import DutySettings
from .sweeper import Sweeper

__all__ = [
    "DutySettings",
    "LeaderLease",
    "Leadership",
    "Prober",
    "Sweeper",
    "new_node_id",
]
