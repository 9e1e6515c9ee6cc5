"""The input-length policy: the long shape past every threshold a config declares, audio from the extractor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import (
    AutoConfig,
    BertConfig,
    BigBirdConfig,
    LlamaConfig,
    LongformerConfig,
    MistralConfig,
    ModernBertConfig,
    Phi3Config,
    Qwen2Config,
    T5Config,
)

from zoo_convert.verify.shapes import (
    MIN_LONG_TOKENS,
    filterbank_frames,
    length_thresholds,
    long_audio_samples,
    long_sequence,
)


@pytest.mark.parametrize(
    ("config", "thresholds"),
    [
        (BertConfig(), {}),
        (MistralConfig(sliding_window=4096), {"sliding_window": 4096}),
        (Qwen2Config(use_sliding_window=False, sliding_window=4096), {}),  # declared, switched off
        (Qwen2Config(use_sliding_window=True, sliding_window=40), {"sliding_window": 40}),
        (LongformerConfig(attention_window=[64, 512]), {"attention_window": 512}),
        (ModernBertConfig(local_attention=128), {"local_attention": 128}),
        (BigBirdConfig(attention_type="block_sparse", block_size=64, num_random_blocks=3), {"block_sparse": 704}),
        (BigBirdConfig(attention_type="original_full"), {}),
        (T5Config(), {"relative_attention_max_distance": 128}),
        (
            Phi3Config(
                hidden_size=32,
                num_attention_heads=2,
                max_position_embeddings=131072,
                original_max_position_embeddings=4096,
                rope_scaling={"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
            ),
            {"rope_scaling": 4096},
        ),
        # Llama 3's rope scaling is fixed at load: no length switch to cross.
        (
            LlamaConfig(
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                }
            ),
            {},
        ),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, dict) else "",
)
def test_the_long_sequence_crosses_every_declared_threshold(config, thresholds: dict[str, int]) -> None:
    assert length_thresholds(config) == thresholds
    assert long_sequence(config) == max([MIN_LONG_TOKENS, *(t + 1 for t in thresholds.values())])


def test_thresholds_of_nested_configs_count() -> None:
    """A two-tower or encoder-decoder config keeps its text model's window in a nested config."""
    config = AutoConfig.for_model("clip", text_config={"max_position_embeddings": 77})
    config.text_config.sliding_window = 300  # no real CLIP has one: the search must reach it anyway
    assert long_sequence(config) == 301


def test_audio_lengths_come_from_the_feature_extractor(zoo_dir: Path) -> None:
    from transformers import AutoConfig, AutoFeatureExtractor

    assert long_audio_samples(zoo_dir / "wav2vec2") == 10 * 16000  # raw audio: 10 s
    assert long_audio_samples(zoo_dir / "whisper") == 30 * 16000  # whisper pads everything to its window
    folder = zoo_dir / "speech-to-text"
    config = AutoConfig.from_pretrained(folder)
    extractor = AutoFeatureExtractor.from_pretrained(folder)
    for seconds in (0.5, 10):
        samples = int(seconds * 16000)
        made = extractor(np.zeros(samples, np.float32), sampling_rate=16000, return_tensors="np")["input_features"]
        # Kaldi's first frame needs a whole 25 ms window: the extractor makes a frame or two fewer than 100 a second.
        assert 0 <= filterbank_frames(samples, folder, config) - made.shape[1] <= 3
    # Capped at what the encoder's position table holds after its two stride-2 convolutions.
    assert filterbank_frames(3600 * 16000, folder, config) == config.max_source_positions * 4
