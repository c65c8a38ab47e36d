"""Settings of the math libraries under PyTorch on the CPU (Intel's MKL and oneDNN), made
by importing this module before torch: MKL reads some of them only as it loads. The
entry points (run.py, the tool scripts that load torch, and the test suite's conftest.py)
import it first. Each is an environment variable, so a value the user sets wins.

  MKL_CBWR=AUTO,STRICT  MKL's conditional numerical reproducibility: its fp32 matrix
      products give the same bits whatever the memory alignment of their inputs (which
      differs from process to process) and, in STRICT mode, whatever the thread count.
      Otherwise MKL picks kernels by alignment, and the same seeded command can end
      with other params.
  MKL_DYNAMIC=FALSE  MKL uses the thread count it is given, never fewer: its batched
      products (attention's) are reproducible only for a fixed thread count.
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=128  oneDNN (the bf16 matrix products) keeps a compiled
      kernel for each shape it meets, 1,024 by default. Packed batches change shape every
      step, and kernels kept among the freed activations fragment the heap, so memory
      keeps growing; 128 holds the shapes of a step (README: Where it runs).
"""

import os

SETTINGS = {
    'MKL_CBWR': 'AUTO,STRICT',
    'MKL_DYNAMIC': 'FALSE',
    'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '128',
}

for name, value in SETTINGS.items():
    os.environ.setdefault(name, value)
