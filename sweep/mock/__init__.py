"""The mock OpenAI server (a programmed TTFT and ITL) and what is measured against it: the client's own added
latency and chunk rate (`bench lab calibrate`) and the short machine-speed check every sweep records."""
