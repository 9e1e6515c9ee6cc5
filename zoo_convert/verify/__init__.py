"""What verification checks, and with what: the library the verify stage and the targets use.

* :mod:`.runtime`: the cases (inputs at each shape and PyTorch's outputs for them) and the ONNX Runtime sessions;
* :mod:`.shapes`: which shapes a model is checked at;
* :mod:`.compare`: one output against its reference, judged against a tolerance;
* :mod:`.generation`: a decoder's greedy generation, step by step, against PyTorch's;
* :mod:`.loadable`: the artifact folder loads the way its users load it (config, tokenizer, processor).

The verdict on a job is the verify stage's (:mod:`zoo_convert.stages.verify`), which calls these.
"""
