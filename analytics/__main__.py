"""``python -m analytics <job> ...`` or ``spark-submit ... analytics/__main__.py <job> ...``."""

import sys

from analytics.cli import main

if __name__ == "__main__":
    sys.exit(main())
