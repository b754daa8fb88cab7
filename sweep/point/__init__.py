"""One load point: the async OpenAI client, request records, vLLM's metrics, the server's /metrics, and the
runner that sends a point's prompts on its schedule (in one process or sharded over several)."""
