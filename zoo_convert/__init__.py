"""zoo_convert: HuggingFace checkpoints in, verified ONNX models and a DuckDB compatibility database out."""

__version__ = "0.1.0"
