"""Suite-wide settings.

Under pytest-xdist (`make test` runs two workers on two cores) each worker's in-process torch computes on one thread:
with torch's default of one thread per core, two workers' OpenMP pools oversubscribe the cores and spin against each
other. Engine servers the tests start still size their own thread pools (engine/executor/worker.py).
"""

from __future__ import annotations

import os

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"
