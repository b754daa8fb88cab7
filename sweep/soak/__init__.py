"""`bench soak`: long mixed and hostile load against one endpoint (the request cases), drift over time windows
from the responses and /metrics, and a pass/fail verdict with `bench gate`'s exit codes."""
