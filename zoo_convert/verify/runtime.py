"""Running a model both ways: ONNX Runtime sessions, generated inputs, the PyTorch reference.

verify and benchmark both run each component on the same inputs in ONNX Runtime
and in PyTorch; optimize runs candidate graphs in ONNX Runtime. This module owns
what they share:

* :func:`ort_session`: a session with the job's thread budget, on the requested
  execution providers this onnxruntime build has (a GPU row on a CPU-only build
  runs on the CPU rather than failing).
* :func:`cases`: a component's inputs at one (batch, sequence) shape, from its
  optimum OnnxConfig (the generators optimum's own validation uses), with real
  tokenized English in place of random ids when the checkpoint ships a tokenizer
  (random ids understate quantization error), and the PyTorch outputs for them. A
  merged decoder is two graphs in one: one :class:`Case` per :class:`Branch`.
* :class:`RuntimeCache`: the per-job memo on ``ExportedModel.cache``, so verifying
  and benchmarking several variants never repeats a forward pass or a session load.
* :class:`ModuleState`: the torch model as loaded, put back before every reference
  forward. Some models rebuild themselves on a forward (BigBird switches to full
  attention for good on an input too short for block-sparse attention, and the
  export's short dummy input is one): the reference must be the model a user
  loads, not the one the export or a shorter input left behind.
* :func:`as_loaded_forward`: the reference is never the model as patched for export.
  optimum's patcher changes what the model computes while it is entered (BigBird-Pegasus
  is switched to full attention, ops are swapped for traceable ones); only the way it
  feeds and reads the model (tuple caches in, legacy caches out, outputs named as the
  graph's) is kept, so the reference is the model a user runs, under the graph's names.

The inputs are what a user sends (:func:`_user_masks`): an attention mask is all ones
for one sequence and, for a batch, padded at one end the way the model's tokenizer pads
(no holes, never mostly padding); position ids follow the mask, as ``generate`` makes
them. Per-token outputs are compared only where the mask keeps a token (``Case.keep``).

optimum's dummy generators draw from the global python, numpy and torch random
generators; :func:`seeded` pins them per shape and puts them back afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import VerifyError, is_our_bug
from ..exporters import diffusion
from ..job import Ahead, Artifact, Component, ExportedModel
from ..job import Branch as Branch
from ..job import Case as Case
from ..job import CaseKey as CaseKey
from ..job import RuntimeCache as RuntimeCache
from ..job import SessionKey as SessionKey
from ..job import TorchAlone as TorchAlone
from ..records import Settings
from . import shapes

if TYPE_CHECKING:
    import onnx
    from onnxruntime import InferenceSession
    from optimum.exporters.onnx import OnnxConfig
    from transformers import PreTrainedTokenizerBase


CPU = ("CPUExecutionProvider",)
# Fixed text, so every run and every variant sees the same tokens.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "ONNX Runtime executes exported transformer models on many kinds of hardware.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "In 1969, two astronauts walked on the Moon while millions watched on television.",
    "Please translate this sentence into French before the meeting starts tomorrow.",
)
_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def ort_session(
    path: Path, *, threads: int, providers: Sequence[str] = CPU, optimize: bool = True
) -> InferenceSession:
    """A new ONNX Runtime session on ``threads`` intra-op threads; ``optimize=False`` runs the graph as written."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    available = ort.get_available_providers()
    usable = [p for p in providers if p in available] or list(CPU)
    return ort.InferenceSession(str(path), sess_options=opts, providers=usable)


def session_for(exported: ExportedModel, artifact: Artifact, comp: Component, settings: Settings) -> InferenceSession:
    """The (memoized) session of ``comp`` in ``artifact``, on the settings' threads and providers."""
    path = artifact.files.get(comp.name)
    if path is None:
        raise VerifyError(f"{artifact.variant} artifact has no graph for component {comp.name!r}")
    sessions = exported.cache.sessions
    key = (str(path), settings.threads, tuple(settings.providers))
    if key not in sessions:
        try:
            sessions[key] = ort_session(path, threads=settings.threads, providers=settings.providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            if is_our_bug(exc):
                raise
            raise VerifyError(f"ONNX Runtime cannot load {Path(path).name}: {exc}") from exc
    return sessions[key]


def cases(
    exported: ExportedModel,
    comp: Component,
    batch: int,
    seq: int,
    settings: Settings,
    *,
    audio_samples: int,
    reference: bool = True,
    encoded: Case | None = None,
) -> dict[Branch, Case]:
    """Inputs and PyTorch outputs of ``comp`` at one shape, one Case per branch (memoized by the shape as fed).

    ``seq`` is capped by the position table; ``audio_samples`` become the frames
    a filterbank model's extractor makes of them (:mod:`zoo_convert.verify.shapes`).
    ``reference=False``: the inputs alone (the benchmark's), with no PyTorch forward and an
    empty ``Case.reference``; a case already computed with its reference serves as well.
    ``encoded``: the encoder's case (with its reference) that a decoder ``comp`` is fed from, as
    a user's pipeline feeds it (:func:`_use_encoded`); without it the decoder's encoder side is
    generated at ``seq`` (verify's toy shapes).
    """
    config = comp.onnx_config
    if config is None:
        raise VerifyError(f"component {comp.name} carries no OnnxConfig to generate inputs from")
    kwargs = shape_kwargs(exported.checkpoint.path, config, batch, seq, audio_samples)
    if encoded is not None:
        # The cross-attention cache is as long as what the encoder made (optimum's generator takes it).
        kwargs["encoder_sequence_length"] = encoder_length(encoded)
    # What the user fixed beyond batch, length and audio samples (image size, channels, ...) wins at every shape.
    kwargs.update({k: v for k, v in settings.shapes.items()
                   if k not in ("batch_size", "sequence_length", "audio_sequence_length")})  # fmt: skip
    memo = exported.cache.cases
    # Keyed by what is fed: a whisper encoder sees the same 30 s at every requested length.
    key: CaseKey = (comp.name, *sorted(kwargs.items()))
    if not reference:
        if key in memo:
            return memo[key]
        key = (*key, ("inputs_only", 1))  # never handed to verify, which needs the reference
    if key in exported.cache.failed:
        raise exported.cache.failed[key]
    if key not in memo:
        if exported.cache.references_done or comp.torch_module is None:
            # After verify.references, a PyTorch forward here would run torch where it must not:
            # a forked child (OpenMP deadlocks) or a job whose torch model is already released.
            raise RuntimeError(f"the PyTorch reference of {comp.name} at {key[1:]} was not computed in advance")
        try:
            memo[key] = {
                branch: _make_case(exported, comp, branch_config, branch, outputs, kwargs, settings, reference, encoded,
                                   key=key)
                for branch, branch_config, outputs in _branches(config)
            }
        except Exception as exc:
            exported.cache.failed[key] = exc
            raise
    return memo[key]


def _branches(config: OnnxConfig) -> list[tuple[Branch, OnnxConfig, tuple[str, ...]]]:
    """(branch, config, outputs to check) per branch: a merged decoder is two graphs in one."""
    if not getattr(config, "is_merged", False):
        return [(Branch.WHOLE, config, tuple(config.outputs))]
    # The cache branch's outputs are those of the decoder-with-past graph before
    # merging; the merge pads the rest (the constant cross-attention cache) with placeholders.
    unmerged = branch_config(config, is_merged=False)
    return [
        (Branch.NO_CACHE, branch_config(config, use_cache_branch=False), tuple(config.outputs)),
        (Branch.CACHE, branch_config(config, use_cache_branch=True), tuple(unmerged.outputs)),
    ]


def branch_config(config: OnnxConfig, **flags: bool) -> OnnxConfig:
    """A copy of a merged decoder's config with ``flags`` set, on its wrapped decoder config too.

    Composite encoder-decoders (vision-encoder-decoder) delegate input generation to
    ``_decoder_onnx_config``: a flag set on the outer copy alone would generate the
    other branch's inputs.
    """
    branch = copy.copy(config)
    for name, value in flags.items():
        setattr(branch, name, value)
    inner = getattr(config, "_decoder_onnx_config", None)
    if inner is not None and hasattr(inner, "is_merged"):
        branch._decoder_onnx_config = branch_config(inner, **flags)
    return branch


def _clamp_sequence(config: OnnxConfig, seq: int) -> int:
    """Keep sequence (+ an equally long past) within the model's position table."""
    model_config = getattr(config, "_config", None)
    # Multimodal configs (CLIP, OWL-ViT) keep the text position table in text_config, vision-encoder-decoder in decoder.
    scopes = [model_config, getattr(model_config, "text_config", None), getattr(model_config, "decoder", None)]
    limits = [
        getattr(scope, name)
        for scope in scopes
        for name in ("n_positions", "max_position_embeddings", "max_target_positions")
        if isinstance(getattr(scope, name, None), int)
    ]
    if not limits:
        return seq
    limit = int(min(limits)) // (2 if getattr(config, "use_past_in_inputs", False) else 1)
    return max(1, min(seq, limit))


def _make_case(
    exported: ExportedModel,
    comp: Component,
    config: OnnxConfig,
    branch: Branch,
    outputs: tuple[str, ...],
    kwargs: dict[str, int],
    settings: Settings,
    reference: bool = True,
    encoded: Case | None = None,
    *,
    key: CaseKey = (),
) -> Case:
    cache = exported.cache
    # The first case of a component runs PyTorch twice: a forward that differs from itself samples.
    first = reference and not any(k[0] == comp.name for k in cache.cases)
    with seeded(kwargs["batch_size"] * 1000 + kwargs["sequence_length"]), processor_fallback():
        inputs = config.generate_dummy_inputs(framework="pt", **kwargs)
        label = f"{kwargs['batch_size']}x{_length(config, inputs, kwargs)}" + (f"/{branch.value}" if branch.value else "")
        _use_real_text(exported, config, inputs, comp)
        _use_timm_images(exported, inputs)
        diffusion.use_pipeline_inputs(comp.model_type, inputs, kwargs["height"], kwargs["width"])
        _user_masks(exported, inputs)
        if encoded is not None:
            _use_encoded(inputs, encoded)
        torch_inputs = config.rename_ambiguous_inputs(copy.deepcopy(inputs))
        made = _made_ahead(cache, key, branch, torch_inputs, outputs, first) if reference and encoded is None else None
        if made is not None:
            found, repeated = made.found, made.again
        else:
            result = _forward(comp, config, torch_inputs, label, settings) if reference else None
            again = _forward(comp, config, torch_inputs, label, settings) if first else None
            found = _flatten_outputs(config, result) if result is not None else {}
            repeated = _flatten_outputs(config, again) if again is not None else None
        if cache.torch_only:  # the child beside the export: no graph to feed yet
            cache.ahead[(key, branch)] = Ahead(_digest(torch_inputs), outputs, found, repeated)
            return Case(label, branch, torch_inputs, {}, found, outputs, config)
        specs = graph_inputs(exported, comp)
        feed_inputs = config.generate_dummy_inputs_for_validation(dict(inputs), [i.name for i in specs])
    feed = _flatten_inputs(config, feed_inputs)
    if branch is Branch.NO_CACHE:
        feed.update(_empty_past(specs, feed, kwargs["batch_size"]))
    if repeated is not None:
        differ = tuple(n for n in outputs if n in found and not _same(found[n], repeated.get(n)))
        if differ:
            cache.unrepeatable[comp.name] = differ
    keep = {name: k for name in outputs if name in found and (k := _kept(config, name, found[name], feed)) is not None}
    return Case(label, branch, torch_inputs, feed, found, outputs, config, keep)


def _made_ahead(
    cache: RuntimeCache, key: CaseKey, branch: Branch, torch_inputs: dict[str, Any], outputs: tuple[str, ...], first: bool
) -> Ahead | None:
    """The outputs computed beside the export for this case, where they answer the very same question.

    Taken, they leave ``cache.ahead``; refused, they stay (the job's record counts them as unused).
    """
    made = cache.ahead.get((key, branch))
    if made is None or made.outputs != outputs or (made.again is not None) != first or made.inputs != _digest(torch_inputs):
        return None
    return cache.ahead.pop((key, branch))


def _digest(value: Any) -> str:
    """A digest of nested torch inputs: every tensor's dtype, shape and bytes, every other value's repr."""
    import hashlib

    import torch

    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k in v:
                h.update(repr(k).encode())
                walk(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(b"(")
            for item in v:
                walk(item)
            h.update(b")")
        elif isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(repr((t.dtype, tuple(t.shape))).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())

    walk(value)
    return h.hexdigest()


# The encoder's output a decoder is fed, by the name optimum's decoder configs give it.
ENCODER_OUTPUT_INPUTS = ("encoder_outputs", "encoder_hidden_states")


def audio_encoder(config: OnnxConfig) -> bool:
    """Whether a component is an encoder fed audio alone (whisper's, speech_to_text's, moonshine's)."""
    return shapes.audio_input(config) is not None and not shapes.has_text(config)


def encoder_length(encoded: Case) -> int:
    """How long the encoder's output is in its case: the frames (patches, tokens) a decoder attends to."""
    hidden = encoded.reference.get("last_hidden_state")
    if hidden is None or hidden.ndim != 3:
        raise VerifyError(f"the encoder's case {encoded.label} has no last_hidden_state to feed a decoder with")
    return int(hidden.shape[1])


def _use_encoded(inputs: dict[str, Any], encoded: Case) -> None:
    """A decoder's encoder side as a user's pipeline feeds it (optimum's ORTModelForSpeechSeq2Seq, generate).

    The encoder's output on the encoder's case in place of optimum's random hidden states as long
    as the decoder's tokens, and the encoder's own attention mask as the decoder's: what it counts
    (moonshine: samples, speech_to_text: filterbank frames) is what the decoder graph downsamples.
    """
    import torch

    encoder_length(encoded)  # says so where the encoder's case has no output to feed
    hidden = torch.from_numpy(encoded.reference["last_hidden_state"].copy())
    for name in ENCODER_OUTPUT_INPUTS:
        value = inputs.get(name)
        if isinstance(value, (list, tuple)) and value:
            inputs[name] = type(value)([hidden.to(value[0].dtype), *value[1:]])
        elif isinstance(value, torch.Tensor):
            inputs[name] = hidden.to(value.dtype)
    mask = encoded.torch_inputs.get("attention_mask")
    if "attention_mask" in inputs and mask is not None:
        inputs["attention_mask"] = mask.clone()


def _same(a: np.ndarray, b: np.ndarray | None) -> bool:
    """Whether two forwards on one input agree: bit for bit but for the float noise of reordered sums."""
    return b is not None and a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))


def as_loaded_forward(comp: Component, config: OnnxConfig) -> Callable[..., Any]:
    """The torch module called as loaded, fed and read the way the export's patcher feeds and reads it.

    optimum's ``ModelPatcher`` does two things. Entered, it changes what the model
    computes: ops swapped for traceable ones, BigBird-Pegasus's encoder switched to full
    attention, SpeechT5's prenet dropout left on. Its ``patched_forward`` only adapts the
    model's interface to the graph's: arguments the export fixes, tuple caches turned into
    cache objects and back, outputs filtered and named as the graph's. The reference is
    the second without the first: the model a user runs (its ``__call__``, hooks and all),
    under the graph's names.
    """
    module = comp.torch_module
    assert module is not None  # cases() checked it
    patcher = config.patch_model_for_export(module)
    name = patcher.orig_forward_name

    def call(**inputs: Any) -> Any:
        before = vars(module).get(name)  # the export's patcher leaves its own forward behind
        setattr(module, name, patcher.patched_forward)
        try:
            return module(**inputs)
        finally:
            if before is None:
                delattr(module, name)
            else:
                setattr(module, name, before)

    return call


def _forward(comp: Component, config: OnnxConfig, torch_inputs: dict[str, Any], label: str, settings: Settings) -> Any:
    """PyTorch's outputs on ``torch_inputs``, from the model as loaded (a forward may have changed its state)."""
    import torch

    assert comp.torch_module is not None  # cases() checked it
    if comp.as_loaded is not None:
        comp.as_loaded.restore()
    try:
        forward = as_loaded_forward(comp, config)
        with torch_threads(settings.threads), torch.inference_mode():
            return forward(**copy.deepcopy(torch_inputs))
    except Exception as exc:  # noqa: BLE001 - any PyTorch failure is a verify error
        if is_our_bug(exc):
            raise
        raise VerifyError(f"PyTorch forward of {comp.name} at {label} failed: {type(exc).__name__}: {exc}") from exc


# Which attention mask pads an output axis, by optimum's name of the axis.
_MASK_BY_AXIS = (
    ("encoder_sequence", ("encoder_attention_mask", "attention_mask")),
    ("decoder_sequence", ("decoder_attention_mask",)),
    ("sequence", ("attention_mask",)),
)


def _user_masks(exported: ExportedModel, inputs: dict[str, Any]) -> None:
    """Attention masks as users send them: all ones for one sequence, one-sided padding for a batch.

    optimum's generator pads a random share of every row (up to all but one token) and a
    decoder's mask is the concatenation of two such masks, with a hole between the past
    and the new tokens. Here row ``r`` of ``b`` is padded by ``r * length // (2 * b)``
    positions at the side the tokenizer pads (right without one); the pad token takes the
    padded ids, and position ids follow the mask, as ``generate`` computes them.
    """
    tokenizer = _tokenizer(exported)
    side = getattr(tokenizer, "padding_side", "right") if tokenizer is not None else "right"
    pad_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    for name in [n for n in inputs if n.endswith("attention_mask")]:
        mask = inputs[name]
        if not hasattr(mask, "dim") or mask.dim() < 2 or mask.dtype.is_floating_point:
            continue
        rows, length = mask.shape[0], mask.shape[-1]
        mask = mask.new_ones(mask.shape)
        for r in range(1, rows):
            pad = r * length // (2 * rows)
            if pad and side == "left":
                mask[r, ..., :pad] = 0
            elif pad:
                mask[r, ..., length - pad :] = 0
        inputs[name] = mask
        ids_name = "decoder_input_ids" if name == "decoder_attention_mask" else "input_ids"
        ids = inputs.get(ids_name) if name != "encoder_attention_mask" else None
        if ids is not None and pad_id is not None and ids.shape[:-1] == mask.shape[:-1] and ids.shape[-1] <= length:
            inputs[ids_name] = ids.masked_fill(mask[..., length - ids.shape[-1] :] == 0, pad_id)
        positions = inputs.get("position_ids") if name == "attention_mask" else None
        if positions is not None and positions.dim() == 2 and positions.shape[0] == rows and mask.dim() == 2:
            made = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
            if positions.shape[-1] <= length:
                inputs["position_ids"] = made[:, length - positions.shape[-1] :].to(positions.dtype)


def _kept(config: OnnxConfig, name: str, ref: np.ndarray, feed: dict[str, np.ndarray]) -> np.ndarray | None:
    """Where output ``name`` holds a token the attention mask keeps; None where no token is padded.

    An axis named after a sequence is masked by the attention mask of that sequence: the
    mask's last positions (a decoder's new tokens come after its past). Audio components
    are left whole: their masks count samples, their outputs frames.
    """
    if shapes.audio_input(config) is not None and not shapes.has_text(config):
        return None
    keep = None
    for axis, label in config.outputs.get(name, {}).items():
        mask = next(
            (feed[m] for key, masks in _MASK_BY_AXIS if key in label for m in masks if m in feed),
            None,
        )
        if axis == 0 or axis >= ref.ndim or mask is None or mask.ndim != 2 or ref.shape[0] != mask.shape[0]:
            continue
        if ref.shape[axis] > mask.shape[1]:
            continue
        kept = mask[:, mask.shape[1] - ref.shape[axis] :] != 0
        shape = [1] * ref.ndim
        shape[0], shape[axis] = kept.shape
        kept = np.broadcast_to(kept.reshape(shape), ref.shape)
        keep = kept if keep is None else keep & kept
    return None if keep is None or bool(keep.all()) else np.ascontiguousarray(keep)


def _empty_past(specs: list[onnx.ValueInfoProto], feed: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """A merged decoder's first step, fed as ORTModel and transformers.js feed it: every past of length 0.

    The no-cache branch ignores the past, but the graph still declares it; optimum's own
    validation feeds a random past of length 1, which no loader ever sends.
    """
    import onnx

    empty = {}
    for spec in specs:
        if not spec.name.startswith("past_key_values"):
            continue
        generated = feed.get(spec.name)
        shape = []
        for axis, dim in enumerate(spec.type.tensor_type.shape.dim):
            name = dim.dim_param
            if "sequence" in name or "past" in name:
                shape.append(0)
            elif dim.HasField("dim_value"):
                shape.append(dim.dim_value)
            elif generated is not None:
                shape.append(generated.shape[axis])
            else:
                shape.append(batch)  # the only other symbolic axis optimum writes
        dtype = onnx.helper.tensor_dtype_to_np_dtype(spec.type.tensor_type.elem_type)
        empty[spec.name] = np.zeros(shape, dtype=dtype)
    return empty


def _length(config: OnnxConfig, inputs: dict[str, Any], kwargs: dict[str, int]) -> int:
    """The length a shape label shows: tokens, or the frames / samples an audio encoder was fed."""
    audio = shapes.audio_input(config)
    if audio is None or shapes.has_text(config) or audio not in inputs:
        return kwargs["sequence_length"]
    axis = shapes.time_axis(config, audio)
    return int(inputs[audio].shape[axis]) if axis is not None else kwargs["audio_sequence_length"]


def graph_inputs(exported: ExportedModel, comp: Component) -> list[onnx.ValueInfoProto]:
    """Fed inputs of the fp32 graph as exported (all variants share its input names)."""
    from .. import onnx_graph

    return onnx_graph.fed_inputs(comp.graph.graph)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Pin the python, numpy and torch global generators, and restore their states on the way out."""
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


@contextlib.contextmanager
def processor_fallback() -> Iterator[None]:
    """Let optimum's input generators do without a processor config, as most of them already do.

    The dinov2, perceiver and vitpose generators read the checkpoint's processor config for the
    image size and take the last one found, so a checkpoint without ``preprocessor_config.json``
    fails with "IndexError: list index out of range". Handing them ``None`` instead of nothing
    makes them keep the image size and channels of ``config.json``, like every other vision generator.
    """
    from optimum.utils import save_utils

    original = save_utils.maybe_load_preprocessors

    def found_or_none(*args: Any, **kwargs: Any) -> list[Any]:
        return original(*args, **kwargs) or [None]

    save_utils.maybe_load_preprocessors = found_or_none
    try:
        yield
    finally:
        save_utils.maybe_load_preprocessors = original


def processor_shapes(folder: Path) -> dict[str, int]:
    """Dummy-input shapes the checkpoint's processor config fixes (image size, mel frames and bins)."""
    conf = shapes.preprocessor_config(folder)
    found = {k: conf[k] for k in ("nb_max_frames", "feature_size") if isinstance(conf.get(k), int)}
    size = conf.get("crop_size") if conf.get("do_center_crop") else None
    size = size or conf.get("size")
    if isinstance(size, int):
        found.update(height=size, width=size)
    elif isinstance(size, dict) and isinstance(size.get("height"), int) and isinstance(size.get("width"), int):
        found.update(height=size["height"], width=size["width"])
    elif isinstance(size, dict) and isinstance(size.get("shortest_edge"), int):
        found.update(height=size["shortest_edge"], width=size["shortest_edge"])
    return found


def shape_kwargs(folder: Path, config: OnnxConfig, batch: int, seq: int, audio_samples: int) -> dict[str, int]:
    """optimum's dummy-generator shape arguments for ``config`` of the checkpoint in ``folder``, at one shape.

    Tokens are capped by the position table, or fixed where the config fixes them
    (:func:`zoo_convert.verify.shapes.fixed_length`); image size and whisper's mel frames
    come from the checkpoint's processor, else the image size is optimum's default, as
    the export's dummy input has it (the RT-DETR family's generator needs one); a
    filterbank model gets the frames its extractor makes of ``audio_samples``, a
    raw-audio model the samples.
    """
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    fixed = shapes.fixed_length(getattr(config, "_config", None))
    kwargs = {
        "batch_size": batch,
        "sequence_length": fixed or _clamp_sequence(config, seq),
        "audio_sequence_length": audio_samples,
        "height": DEFAULT_DUMMY_SHAPES["height"],
        "width": DEFAULT_DUMMY_SHAPES["width"],
        **processor_shapes(folder),
    }
    audio = shapes.audio_input(config)
    if audio == "input_features":
        kwargs["audio_sequence_length"] = kwargs.get("nb_max_frames") or shapes.filterbank_frames(
            audio_samples, folder, config._config
        )
    if audio is not None and not shapes.has_text(config):
        # An audio encoder's other inputs (Speech2Text's attention mask) run along its audio.
        kwargs["sequence_length"] = kwargs["audio_sequence_length"]
    return kwargs


def _use_real_text(exported: ExportedModel, config: OnnxConfig, inputs: dict[str, Any], comp: Component) -> None:
    """Overwrite token-id inputs with real tokenized text, keeping every shape as generated.

    A pipeline's text encoder reads its own tokenizer's (``text_encoder_3``: the T5 one in ``tokenizer_3/``).
    """
    if exported.checkpoint.library == "diffusers":
        tokenizer = _pipeline_tokenizer(exported, comp.name)
    else:
        tokenizer = _tokenizer(exported)
    if tokenizer is None:
        return
    vocab = getattr(getattr(config, "_normalized_config", None), "vocab_size", None)
    stream = [t for s in SENTENCES for t in tokenizer(s)["input_ids"]]
    if not stream or (isinstance(vocab, int) and max(stream) >= vocab):
        return  # a tokenizer that does not match the model: keep optimum's ids
    for name in ("input_ids", "decoder_input_ids"):
        ids = inputs.get(name)
        if ids is None or ids.dim() != 2 or ids.dtype.is_floating_point:
            continue
        rows, length = ids.shape
        # Each row is a different window of the text, wrapping around, so no row is padding.
        table = [[stream[(r * 7 + i) % len(stream)] for i in range(length)] for r in range(rows)]
        inputs[name] = ids.new_tensor(table)


def _use_timm_images(exported: ExportedModel, inputs: dict[str, Any]) -> None:
    """A timm model's pixel_values become images preprocessed as its ``pretrained_cfg`` says.

    timm's eval transform of the checkpoint (resize by ``crop_pct`` with its interpolation,
    center crop to ``input_size``, ``mean``/``std``) applied to fixed images, so verify sees the
    value range a user feeds, not optimum's uniform noise; the shape stays as generated.
    """
    pixels = inputs.get("pixel_values")
    ckpt = exported.checkpoint
    if ckpt.library != "timm" or pixels is None or pixels.dim() != 4 or pixels.shape[1] != 3:
        return
    import torch
    from timm.data import create_transform, resolve_data_config

    data_config = resolve_data_config(pretrained_cfg=ckpt.config.get("pretrained_cfg") or {})
    transform = create_transform(**data_config, is_training=False)
    batch, _, height, width = pixels.shape
    images = torch.stack([transform(image) for image in sample_images(batch, height, width)])
    if images.shape == pixels.shape:  # a pretrained_cfg whose input_size is not the model's: keep optimum's
        inputs["pixel_values"] = images.to(pixels.dtype)


def sample_images(count: int, height: int, width: int) -> list[Any]:
    """``count`` fixed RGB images a little larger than ``height`` x ``width`` and not square, so resize and crop both act.

    Smooth colour fields with edges and fine grain, like a downscaled photo; the same on every run.
    """
    from PIL import Image, ImageDraw

    images = []
    for i in range(count):
        rng = np.random.default_rng(1000 + i)
        size = (int(width * 1.4) + 3, int(height * 1.2) + 5)
        image = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, size[0] // 2)), int(rng.integers(0, size[1] // 2))
            box = (x0, y0, x0 + int(rng.integers(4, size[0] // 2 + 5)), y0 + int(rng.integers(4, size[1] // 2 + 5)))
            draw.ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        grain = rng.normal(0, 6, (size[1], size[0], 3))
        images.append(Image.fromarray(np.clip(np.asarray(image, dtype=np.float64) + grain, 0, 255).astype(np.uint8)))
    return images


def _tokenizer(exported: ExportedModel) -> PreTrainedTokenizerBase | None:
    cache = exported.cache
    if not cache.tokenizer_loaded:
        from transformers import AutoTokenizer

        ckpt = exported.checkpoint
        try:
            cache.tokenizer = AutoTokenizer.from_pretrained(str(ckpt.path), trust_remote_code=ckpt.trust_remote_code)
        except Exception:  # noqa: BLE001 - no usable tokenizer means optimum's random ids
            cache.tokenizer = None
        cache.tokenizer_loaded = True
    return cache.tokenizer


def _pipeline_tokenizer(exported: ExportedModel, component: str) -> PreTrainedTokenizerBase | None:
    """The tokenizer the pipeline feeds a text encoder with (export keeps those it loaded); None for other components."""
    folder = diffusion.tokenizer_folder(component)
    return None if folder is None else exported.cache.pipeline_tokenizers.get(folder)


def _flatten_inputs(config: OnnxConfig, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Nested past_key_values become past_key_values.N.key/value, as named in the graph."""
    feed: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        if isinstance(value, (list, tuple)):
            value = config.flatten_output_collection_property(name, value)
        if isinstance(value, dict):
            feed.update({k: v.detach().cpu().numpy() for k, v in value.items()})
        else:
            feed[name] = value.detach().cpu().numpy()
    return feed


def _flatten_outputs(config: OnnxConfig, outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """PyTorch outputs under their ONNX names (past_key_values -> present.N.key/value), as optimum validates."""
    flat: dict[str, np.ndarray] = {}
    to_onnx = config.torch_to_onnx_output_map
    for name, value in outputs.items():
        name = "present" if name == "past_key_values" else name
        if isinstance(value, (list, tuple)):
            value = config.flatten_output_collection_property(to_onnx.get(name, name), value)
            flat.update({k: v.detach().float().cpu().numpy() for k, v in value.items()})
        elif hasattr(value, "detach"):
            flat[to_onnx.get(name, name)] = value.detach().float().cpu().numpy()
    return flat


def feed_for(session: InferenceSession, case: Case, comp: Component) -> dict[str, np.ndarray]:
    """The case's inputs for ``session``, cast to its declared float types (fp16 graphs without fp32 IO)."""
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in case.feed:
            raise VerifyError(f"{comp.name}: graph input {spec.name!r} has no generated value at {case.label}")
        value = case.feed[spec.name]
        target = _ORT_FLOAT.get(spec.type)
        feed[spec.name] = value.astype(target) if target is not None and value.dtype != target else value
    return feed


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run PyTorch with ``n`` intra-op threads, restoring the previous setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
