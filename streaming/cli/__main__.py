"""``python -m streaming.cli``: the ``txstream`` command."""

import sys

from streaming.cli import main

sys.exit(main())
