"""Reusable model layers: linear (TP/quantization-ready), rotary embedding, RMSNorm, activations."""
