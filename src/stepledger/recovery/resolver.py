"""Moved to :mod:`stepledger.resolution.resolver` (below both the SDK and the daemon).

This path keeps old imports working: it is the same module object.
"""

import sys

from stepledger.resolution import resolver as _moved
from stepledger.resolution.resolver import *  # noqa: F403

sys.modules[__name__] = _moved
