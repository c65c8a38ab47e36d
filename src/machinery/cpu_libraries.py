"""Settings of the math libraries under PyTorch on the CPU (Intel's MKL, oneDNN and GNU
OpenMP), made by importing this module before torch: the libraries read them only as
they load. The entry points (run.py, the tool scripts that load torch, and the test
suite's conftest.py) import it first. Each is an environment variable, so a value the
user sets wins. Then it loads torch, and has MKL choose its vector-math kernels in one
thread (choose_vector_math_kernels).

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
  GOMP_SPINCOUNT=10000  how long a thread of torch's OpenMP pool (GNU's, in the pip
      builds) spins at the end of a parallel region before it sleeps: 300,000 by default.
      A training step runs thousands of small parallel regions; where another program
      keeps a core busy, a thread that spins takes the core the thread still working
      needs, and a step took ten times as long (docs/speed.md). 10,000 spins cover the
      waits of an idle machine, so its speed is unchanged; the work each thread does,
      and so every result, is the same.
"""

import os

SETTINGS = {
    'MKL_CBWR': 'AUTO,STRICT',
    'MKL_DYNAMIC': 'FALSE',
    'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '128',
    'GOMP_SPINCOUNT': '10000',
}

for name, value in SETTINGS.items():
    os.environ.setdefault(name, value)

import torch  # noqa: E402 (after the settings, which MKL reads as it loads)

# MKL's vector math (VML), which torch calls for the elementwise sqrt, exp, tanh, ... of
# contiguous fp32 and fp64 tensors, each thread on its share. MKL picks each function's
# kernel at its first call, and when that first call comes from two threads at once, one of
# them can run a low-accuracy kernel on its share (pytorch/pytorch#188792, MKL 2024.2): on a
# 2-core Intel Xeon, the first AdamW step's sqrt of one process in ten or so, so that a
# run, or a resumed run's first step, ended with other params. A call on one element, in
# this thread alone, makes the choice before any thread can race to it.
VECTOR_MATH = (
    'abs', 'acos', 'asin', 'atan', 'cos', 'erf', 'erfc', 'erfinv', 'exp', 'expm1', 'log',
    'log10', 'log1p', 'log2', 'sin', 'sqrt', 'tan', 'tanh', 'trunc',
)  # fmt: skip


def choose_vector_math_kernels():
    """Each of VECTOR_MATH called once on one element, in fp32 and fp64: MKL's kernel choice
    made in this thread, before any parallel call."""
    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype)
        for name in VECTOR_MATH:
            getattr(torch, name)(one)


choose_vector_math_kernels()
