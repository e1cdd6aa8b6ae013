"""Moved to :mod:`stepledger.resolution.deadletters` (below both the SDK and the daemon).

This path keeps old imports working: it is the same module object.
"""

import sys

from stepledger.resolution import deadletters as _moved
from stepledger.resolution.deadletters import *  # noqa: F403

sys.modules[__name__] = _moved
