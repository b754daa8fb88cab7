"""`bench simulate` and its inputs: the step-cost profile (`bench model profile`), the engine's own scheduler
driven in virtual time by it (with the API process's hand-over in front), the run it writes, and the fit of the
profile's serving terms to measured runs (`bench lab profile-serving`). The executor and the cost model are the
engine's (engine/executor/simulated.py, cost_model.py)."""
