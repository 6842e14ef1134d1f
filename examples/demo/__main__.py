"""``python -m examples.demo``: see :mod:`examples.demo.cli`."""

import sys

from examples.demo.cli import main

sys.exit(main())
