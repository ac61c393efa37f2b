"""``python -m topology.cli``: the ``agent-reach`` command line."""

import sys

from .entrypoint import main

sys.exit(main())
