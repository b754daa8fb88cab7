"""`bench compare`: several targets (engine settings, git refs, launch templates, URLs, llama.cpp) under one
workload, in interleaved rounds; each target an ordinary `bench sweep` run directory."""
