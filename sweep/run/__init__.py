"""A run: a sweep of points (or a search for the most load under an SLO), repeats, the launched server, the run
directory (config.json, points, requests.jsonl) and what it records about the target, the machine and the cost."""
