"""zoo_convert: HuggingFace checkpoints in, verified ONNX models and a DuckDB compatibility database out."""

import os

# optimum-onnx installs a second distribution of the `optimum` package, and diffusers warns about
# that on import ("Multiple distributions found for package optimum") in every process, a line
# that says nothing about the run; its other warnings are errors in our records anyway.
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

__version__ = "0.1.0"
