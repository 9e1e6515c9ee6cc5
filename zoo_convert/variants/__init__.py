"""The graph transformations that make a variant from an exported graph: float16 and quantization.

* :mod:`.fp16`: fp32 -> fp16 with float32 inputs and outputs kept, index arithmetic left in fp32;
* :mod:`.quantize`: int8 / uint8 dynamic quantization streamed one weight at a time.

They work on ONNX files and protos only (no torch, no ONNX Runtime sessions): which variants a job makes,
in which child and how each is verified is the optimize stage's business (:mod:`zoo_convert.stages.optimize`).
"""
