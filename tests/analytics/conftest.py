"""Make ``import analytics`` reach the real package, not this test directory.

pytest's default import mode puts ``tests/`` on ``sys.path``, where ``tests/analytics``
(no ``__init__``) is a namespace package called ``analytics`` that shadows the editable
install's finder. A regular package later on ``sys.path`` wins over a namespace portion,
so adding the repository root is enough.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)
_loaded = sys.modules.get("analytics")
if _loaded is not None and getattr(_loaded, "__file__", None) is None:
    del sys.modules["analytics"]
