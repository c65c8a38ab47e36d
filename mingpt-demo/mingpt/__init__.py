"""minGPT: a minimal, readable GPT implementation (Karpathy, 2020 edition).

The package is split into three modules:

- ``model``: the GPT language model and its configuration classes,
- ``trainer``: a small, generic training loop,
- ``utils``: seeding and autoregressive sampling helpers.
"""
