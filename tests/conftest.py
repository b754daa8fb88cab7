"""Suite-wide settings.

Under pytest-xdist (`make test` runs two workers on two cores) each worker's in-process torch computes on one thread:
with torch's default of one thread per core, two workers' OpenMP pools oversubscribe the cores and spin against each
other. Engine servers the tests start still size their own thread pools (engine/executor/worker.py).

Every engine the suite starts (in-process or a server it launches) runs its forward eagerly: SERVELAB_ENFORCE_EAGER=1,
unless the environment sets it. The compiled forward costs seconds at each engine start even with a warm inductor
cache; tests/engine/models/test_compiled_forward.py unsets it and runs the equivalence checks compiled.
"""

from __future__ import annotations

import os

os.environ.setdefault("SERVELAB_ENFORCE_EAGER", "1")

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"
