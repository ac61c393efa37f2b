"""``python -m topology.demo --region NAME=URL …``: the demo against nodes already running."""

import sys

from .driver import main

sys.exit(main())
