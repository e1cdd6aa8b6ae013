"""The recovery daemon's heartbeat file (read by ``stepledger recover-health``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_health(path: Path, payload: dict[str, Any]) -> None:
    """Write the heartbeat atomically, so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)
