"""zoo_convert: HuggingFace checkpoints in, verified ONNX models and a DuckDB compatibility database out."""

import os

# optimum-onnx installs a second distribution of the `optimum` package, and diffusers warns about
# that on import ("Multiple distributions found for package optimum") in every process, a line
# that says nothing about the run; its other warnings are errors in our records anyway.
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
# numpy's OpenBLAS starts a thread per CPU on its first large call (verify's dot products, a feature
# extractor's matmul), and each of them then spin-waits for the next call, on CPUs that the job's
# PyTorch and ONNX Runtime, or the node's other jobs, are using: ~6 % of make demo's CPU time went
# to that spinning (perf, 2 cores). Read once, when numpy is imported: every process that imports
# zoo_convert first (the CLI, the fork server and the jobs it forks) gets one BLAS thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
