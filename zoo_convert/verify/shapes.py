"""Input lengths: how long the text and audio that verify and benchmark feed a model are.

verify runs every component at the short shapes of ``Settings.verify_shapes``
(toy lengths that differ from the export's dummy input, so dynamic axes are
exercised) and at one long shape, batch 1, at the length the model is used at:

* text: :func:`long_sequence` tokens, at least :data:`MIN_LONG_TOKENS` and past
  every length threshold the config declares (:func:`length_thresholds`): a graph
  traced at a short dummy input can freeze the short-length path of a model that
  computes differently beyond one. The runtime caps it by the position table
  (half of it for a decoder fed a past as long as its input);
* audio: :func:`long_audio_samples`, the window of a feature extractor that pads
  every input to one (whisper: 30 s), else :data:`TYPICAL_AUDIO_S` of audio;
* images: the processor's size, as at every shape: there is nothing longer to try.

Audio lengths are counted in samples. A raw-audio model (``input_values``) is fed
them as they are; a filterbank model (``input_features`` from a feature
extractor, Speech2Text-style) is fed the frames its extractor makes of them
(:func:`filterbank_frames`), capped by what its encoder's position table holds
after convolutional subsampling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import Settings
from ..sources import read_json

if TYPE_CHECKING:
    from optimum.exporters.onnx import OnnxConfig
    from transformers import PretrainedConfig

# Audio models see ``sequence * AUDIO_SAMPLES_PER_STEP`` samples at a short verify shape.
AUDIO_SAMPLES_PER_STEP = 1000
LONG_BATCH = 1
MIN_LONG_TOKENS = 128
TYPICAL_AUDIO_S = 10.0
# What feature extractors assume when their config does not say.
DEFAULT_SAMPLING_RATE = 16000
# Kaldi-style filterbanks (Speech2Text) shift their 25 ms window by 10 ms: 100 frames a second.
DEFAULT_FRAMES_PER_S = 100

TEXT_INPUTS = ("input_ids", "decoder_input_ids")
AUDIO_INPUTS = ("input_values", "input_features")
# Rope scalings whose frequencies change with the length of the input; the others are fixed at load.
_LENGTH_DEPENDENT_ROPE = ("longrope", "dynamic")


@dataclass(frozen=True)
class Shape:
    """One verify shape of a component.

    Attributes:
        batch: rows.
        sequence: tokens, before the runtime caps them by the position table.
        audio_samples: samples of audio, before a filterbank model's extractor makes frames of them.
        long: the long shape, not one of ``Settings.verify_shapes``.
    """

    batch: int
    sequence: int
    audio_samples: int
    long: bool = False


def verify_shapes(config: OnnxConfig, folder: Path, settings: Settings) -> list[Shape]:
    """The short shapes, then the long one unless switched off or the component has no length to grow.

    Images have none, nor has a model whose config fixes its length (:func:`fixed_length`):
    it runs at that length at every batch of the short shapes. Shapes the user fixed
    (``Settings.shapes``: ``--batch-size``, ``--sequence-length``...) replace the defaults.
    """
    given = settings.shapes
    length = fixed_length(config._config)
    if length is not None:
        batches = dict.fromkeys(given.get("batch_size", b) for b, _ in settings.verify_shapes)
        return [Shape(b, length, length * AUDIO_SAMPLES_PER_STEP) for b in batches]
    pairs = dict.fromkeys((given.get("batch_size", b), given.get("sequence_length", s)) for b, s in settings.verify_shapes)
    found = [Shape(b, s, given.get("audio_sequence_length", s * AUDIO_SAMPLES_PER_STEP)) for b, s in pairs]
    if settings.verify_long and has_length(config):
        found.append(Shape(LONG_BATCH, long_sequence(config._config), long_audio_samples(folder), long=True))
    return found


def fixed_length(config: PretrainedConfig | None) -> int | None:
    """Tokens a model runs at, and only at, where its config fixes them; None where any length works.

    Nystromformer's landmark attention averages ``segment_means_seq_len`` tokens into
    ``num_landmarks`` segments: fed another length it fails, or silently mixes the rows
    of a batch. (With as many landmarks as tokens it is exact attention, at any length.)
    """
    for scope in _scopes(config) if config is not None else ():
        length, landmarks = getattr(scope, "segment_means_seq_len", None), getattr(scope, "num_landmarks", None)
        if isinstance(length, int) and isinstance(landmarks, int) and length > 0 and landmarks != length:
            return length
    return None


def length_thresholds(config: PretrainedConfig) -> dict[str, int]:
    """Token counts past which the model computes differently, by the config field that declares each.

    Sliding windows (mistral, qwen2 with ``use_sliding_window``, gemma2/3, phi3),
    local attention windows (longformer ``attention_window``, modernbert
    ``local_attention``, gpt-neo ``window_size``), BigBird's block-sparse attention
    (full attention up to ``(5 + 2 * num_random_blocks) * block_size`` tokens),
    rope scalings that switch with length (``longrope``, ``dynamic``: past the
    original context) and T5-style relative-position buckets (saturated past
    ``relative_attention_max_distance``). Nested configs (``text_config``,
    ``encoder``, ``decoder``) are searched too.
    """
    found: dict[str, int] = {}
    for scope in _scopes(config):
        for name in ("sliding_window", "attention_window", "local_attention", "window_size"):
            value = getattr(scope, name, None)
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
                value = max(value)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found[name] = max(value, found.get(name, 0))
        if getattr(scope, "attention_type", None) == "block_sparse":
            block, random_blocks = getattr(scope, "block_size", None), getattr(scope, "num_random_blocks", None)
            if isinstance(block, int) and isinstance(random_blocks, int):
                found["block_sparse"] = (5 + 2 * random_blocks) * block
        rope = getattr(scope, "rope_scaling", None)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) in _LENGTH_DEPENDENT_ROPE:
            original = rope.get("original_max_position_embeddings") or getattr(
                scope, "original_max_position_embeddings", None
            )
            original = original or getattr(scope, "max_position_embeddings", None)
            if isinstance(original, int):
                found["rope_scaling"] = original
        distance = getattr(scope, "relative_attention_max_distance", None)
        if isinstance(distance, int) and distance > 0:
            found["relative_attention_max_distance"] = distance
    return found


def long_sequence(config: PretrainedConfig) -> int:
    """Tokens of the long shape: at least MIN_LONG_TOKENS, one past every threshold (before the position cap)."""
    return max([MIN_LONG_TOKENS, *(t + 1 for t in length_thresholds(config).values())])


def long_audio_samples(folder: Path) -> int:
    """Samples of the long shape: the extractor's padding window (whisper: 30 s), else TYPICAL_AUDIO_S."""
    conf = preprocessor_config(folder)
    rate = _int(conf, "sampling_rate") or DEFAULT_SAMPLING_RATE
    window = _int(conf, "n_samples")
    frames, hop = _int(conf, "nb_max_frames"), _int(conf, "hop_length")
    if window is None and frames is not None and hop is not None:
        window = frames * hop
    return window or round(TYPICAL_AUDIO_S * rate)


def filterbank_frames(samples: int, folder: Path, config: PretrainedConfig) -> int:
    """Frames a filterbank extractor makes of ``samples`` (one per hop), capped by the encoder's positions.

    The cap is ``max_source_positions`` times the encoder's convolutional
    subsampling (Speech2Text: ``num_conv_layers`` convolutions of stride 2): the
    position table the frames reach after subsampling.
    """
    conf = preprocessor_config(folder)
    rate = _int(conf, "sampling_rate") or DEFAULT_SAMPLING_RATE
    hop = _int(conf, "hop_length") or rate // DEFAULT_FRAMES_PER_S
    frames = max(1, samples // hop)
    positions = getattr(config, "max_source_positions", None)
    if isinstance(positions, int):
        layers = getattr(config, "num_conv_layers", 0)
        frames = min(frames, positions * 2 ** (layers if isinstance(layers, int) else 0))
    return frames


def preprocessor_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's preprocessor_config.json (feature extractor or image processor); {} without one."""
    path = Path(folder) / "preprocessor_config.json"
    if not path.is_file():
        return {}
    conf = read_json(path)  # fetch vetted it; looked at again before it is opened
    return conf if isinstance(conf, dict) else {}


def has_text(config: OnnxConfig) -> bool:
    """Whether a component is fed token ids."""
    return any(name in config.inputs for name in TEXT_INPUTS)


def audio_input(config: OnnxConfig) -> str | None:
    """The component's audio input (``input_values`` raw samples, ``input_features`` frames), if any."""
    return next((name for name in AUDIO_INPUTS if name in config.inputs), None)


def has_length(config: OnnxConfig) -> bool:
    """Whether a component has a length a long shape can grow (text or audio; images have none)."""
    return has_text(config) or audio_input(config) is not None


def length_unit(config: OnnxConfig) -> str:
    """What a shape label's length counts for a component: tokens, frames or samples."""
    audio = audio_input(config)
    if has_text(config) or audio is None:
        return "tokens"
    return "samples" if audio == "input_values" else "frames"


def time_axis(config: OnnxConfig, name: str) -> int | None:
    """The axis of input ``name`` that is its length: the dynamic axis named after a sequence."""
    return next((axis for axis, label in config.inputs[name].items() if "sequence" in label), None)


def _scopes(config: Any) -> Iterator[Any]:
    """A config and the configs nested in it (text_config, encoder, decoder, ...)."""
    from transformers import PretrainedConfig

    yield config
    for value in getattr(config, "__dict__", {}).values():
        if isinstance(value, PretrainedConfig):
            yield from _scopes(value)


def _int(conf: dict[str, Any], key: str) -> int | None:
    value = conf.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
