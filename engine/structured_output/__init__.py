"""Structured outputs: grammar-constrained decoding with xgrammar (JSON schema, regex, choice, EBNF grammar).

`StructuredOutputsParams` (params.py) rides on SamplingParams; validation and compilation are in
backend_xgrammar.py; the engine-side compile cache, bitmasks and matchers are in manager.py. Importing this package
loads neither torch nor xgrammar.
"""

from engine.structured_output.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
