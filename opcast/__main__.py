"""``python -m opcast`` runs the CLI."""

import sys

from opcast.cli import main

sys.exit(main())
