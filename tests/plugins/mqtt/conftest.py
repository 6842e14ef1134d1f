"""Make ``plugins`` resolve to the repository's plugin package in these tests.

pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, prepend import mode), where the
directory ``tests/plugins`` would be found as a namespace package ``plugins`` before the
editable install's finder is asked, hiding ``plugins.mqtt``. The repository root goes
first, and a namespace ``plugins`` imported before this runs is dropped. (Same fix as
tests/plugins/kafka/conftest.py; one shared tests/plugins/conftest.py would do for both.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])
HERE = str(Path(__file__).resolve().parent)
for _path in (HERE, ROOT):
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
_loaded = sys.modules.get("plugins")
if _loaded is not None and getattr(_loaded, "__file__", None) is None:
    for _name in [m for m in sys.modules if m == "plugins" or m.startswith("plugins.")]:
        del sys.modules[_name]
