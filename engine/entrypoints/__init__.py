"""The OpenAI-compatible HTTP server (`bench serve`) and its engine process."""
