"""The exporters: a checkpoint's torch modules in, ONNX graphs out.

* optimum's exporter (``optimum.exporters.onnx``) is called from :mod:`zoo_convert.stages.export`, which picks
  the exporter per row (``Settings.exporter``: optimum, torch, or auto);
* :mod:`.torch_onnx` is the torch exporter (``torch.onnx.export(dynamo=True)``) of one graph, and
  :mod:`.torch_decoder` / :mod:`.torch_seq2seq` lay decoders with past and encoder-decoders out as optimum does;
* :mod:`.generic` exports a model optimum has no ONNX config for (the generic torch path);
* :mod:`.merge` merges an encoder-decoder's two decoders into optimum's ``decoder_model_merged.onnx``, at less cost;
* :mod:`.diffusion` reads, vets and exports a diffusers pipeline, one graph per component.

Each takes the job's objects (:mod:`zoo_convert.job`) and never imports a stage, verification or the farm.
"""
