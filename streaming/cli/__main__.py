"""``python -m streaming.cli``: the ``txstream`` command (also ``spark-submit`` of this file)."""

import os
import sys

if not __package__:
    # Run as a file (spark-submit .../streaming/cli/__main__.py), Python puts this directory
    # first on the path, where the command modules would shadow top-level packages of the same
    # name (console).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from streaming.cli import main

sys.exit(main())
