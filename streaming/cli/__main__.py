"""``python -m txstream.streaming.cli``: the ``txstream`` command (also ``spark-submit`` of this
file)."""

import sys

from txstream.streaming.cli import main

sys.exit(main())
