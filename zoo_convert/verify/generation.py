"""Generation, not one forward: a decoder exported with past, run the way it is used.

verify's shape checks run a merged decoder's two branches once each. A decoder is
used by generating: a prompt with an empty past (the first step ORTModel and
transformers.js run), then one token per step on the cache the steps before built.
This module checks that, for every decoder and encoder-decoder exported with past:

* PyTorch's side (:func:`reference`, once per job, with the references): ``generate()``
  greedy (do_sample=False) for :data:`STEPS` new tokens on a real tokenized prompt,
  with the raw logits of every step. The checkpoint's own logits processors (forced or
  suppressed tokens, penalties, beams) and its EOS stop are left out: they are the
  generation loop's business, not the graph's, and ONNX Runtime's side, which runs
  without torch, takes the plain argmax as well; so all 16 steps are always compared.
  The model is the one a user loads (never inside optimum's export patcher).
* ONNX Runtime's side (:func:`check`, in the optimize child that made the variant):
  an encoder-decoder's encoder graph of the same variant once, then the decoder graph
  step by step with its own cache, teacher-forced on PyTorch's tokens (a tiny random
  model whose greedy output is degenerate still exercises positions, masks and the
  cache), every step's logits compared with PyTorch's at the variant's tolerance
  (``1x13/step05``: step 5 on a 13-token prompt). Then ORT's own greedy tokens,
  free-running on its own cache, against PyTorch's: the share that is identical.

verify judges the step checks with the others; fp32's tokens must be PyTorch's (a
divergence where PyTorch's two candidates are closer than the tolerance is a tie, not
a mismatch); the other variants' share is information.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import VerifyError, first_line, is_our_bug
from ..job import Artifact, Generation, GenerationAhead
from ..records import Settings, Tolerance, variant_files
from .compare import compare
from .runtime import (
    _ORT_FLOAT,
    SENTENCES,
    Branch,
    _digest,
    _tokenizer,
    cases,
    session_for,
    torch_threads,
)

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

    from ..job import Component, ExportedModel

STEPS = 16
# The prompt is the first sentence, cut to this many tokens (and to the position table).
PROMPT_TOKENS = 24


@dataclass(frozen=True)
class Reference:
    """PyTorch's greedy generation, what ONNX Runtime's side replays.

    Attributes:
        label: the prompt's shape, ``1x13`` (the encoder's input for an encoder-decoder).
        encoder_feed: the encoder graph's inputs (empty for a decoder-only model).
        prompt: the decoder's first input ids, [1, n] (an encoder-decoder's decoder start token).
        tokens: PyTorch's greedy tokens, [STEPS].
        logits: PyTorch's raw logits at every step, [STEPS, vocab].
    """

    label: str
    encoder_feed: dict[str, np.ndarray]
    prompt: np.ndarray
    tokens: np.ndarray
    logits: np.ndarray


@dataclass
class _Memo:
    """The job's PyTorch side, on ``RuntimeCache.generation``: the reference, or why there is none."""

    reference: Reference | None = None
    note: str | None = None
    done: bool = False


def decoder(exported: ExportedModel) -> Component | None:
    """The component that generates: a graph fed its past key values and giving logits; None without one."""
    for comp in exported.components:
        graph = comp.graph.graph
        if _generates([i.name for i in graph.input], [o.name for o in graph.output]):
            return comp
    return None


def _generates(inputs: Iterable[str], outputs: Iterable[str]) -> bool:
    """Whether a graph with these input and output names (or a config that names them so) generates."""
    return any(name.startswith("past_key_values") for name in inputs) and "logits" in outputs


def _encoder(exported: ExportedModel, dec: Component) -> Component | None:
    others = [c for c in exported.components if c is not dec]
    return next((c for c in others if c.name == "encoder_model"), others[0] if len(others) == 1 else None)


def reference(exported: ExportedModel, settings: Settings) -> None:
    """PyTorch's side once per job (memoized): greedy generate() and its logits, or why it cannot run.

    Must run while the job holds the torch model (``verify.references``).
    """
    memo = _memo(exported)
    if memo.done:
        return
    memo.done = True
    dec = decoder(exported)
    if dec is None or not settings.verify_generation:
        return
    try:
        memo.reference = _reference(exported, dec, settings)
    except _NotChecked as exc:
        memo.note = str(exc)
    except Exception as exc:  # noqa: BLE001 - a model whose PyTorch generate() fails is recorded, not raised
        if is_our_bug(exc):
            raise
        memo.note = f"PyTorch generate() failed: {type(exc).__name__}: {first_line(exc)}"


def reference_ahead(exported: ExportedModel, settings: Settings) -> None:
    """The generation :func:`reference` would compute, in the child that computes verify's references beside the export.

    ``exported`` is provisional (no graph yet): the decoder is the component whose config gives a past and
    logits. Into ``RuntimeCache.generation_ahead``, which :func:`reference` takes where its own generate()
    inputs digest to the ones fed here. Not for an encoder fed token ids (t5, bart): the job swaps in the
    real prompt only where the encoder graph has that input, which is not known before the export. A
    generation that fails here is the job's to fail and record.
    """
    if not settings.verify_generation:
        return
    configs = {c.name: c.onnx_config for c in exported.components if c.onnx_config is not None}
    dec = next((c for c in exported.components if c.name in configs
                and _generates(configs[c.name].inputs, configs[c.name].outputs)), None)  # fmt: skip
    enc = _encoder(exported, dec) if dec is not None and len(exported.components) > 1 else None
    if dec is None or (enc is not None and (enc.name not in configs or "input_ids" in configs[enc.name].inputs)):
        return
    with contextlib.suppress(Exception):
        _, _, _, kwargs = _generate_inputs(exported, dec, settings)
        tokens, logits = _generated(dec, kwargs, settings)
        exported.cache.generation_ahead = GenerationAhead(dec.name, _digest(kwargs), tokens, logits)


class _NotChecked(Exception):
    """Generation cannot be checked for this model (the reason is recorded)."""


def _memo(exported: ExportedModel) -> _Memo:
    cache = exported.cache
    if not isinstance(cache.generation, _Memo):
        cache.generation = _Memo()
    return cache.generation


def _reference(exported: ExportedModel, dec: Component, settings: Settings) -> Reference:
    label, encoder_feed, prompt, kwargs = _generate_inputs(exported, dec, settings)
    tokens, logits = _made_ahead(exported, dec, kwargs) or _generated(dec, kwargs, settings)
    if tokens.shape[0] != STEPS or logits.shape[0] != STEPS:
        raise _NotChecked(f"PyTorch generate() made {tokens.shape[0]} tokens, not {STEPS}")
    return Reference(label, encoder_feed, prompt, tokens, logits)


def _generate_inputs(
    exported: ExportedModel, dec: Component, settings: Settings
) -> tuple[str, dict[str, np.ndarray], np.ndarray, dict[str, Any]]:
    """(label, the encoder graph's feed, the decoder's prompt, generate()'s keyword inputs) of the one generation."""
    import torch
    from transformers import GenerationMixin

    if dec.torch_module is None or not isinstance(dec.torch_module, GenerationMixin):
        raise _NotChecked(f"{dec.name}'s PyTorch module cannot generate")
    enc = _encoder(exported, dec) if len(exported.components) > 1 else None
    if len(exported.components) > 1 and enc is None:
        raise _NotChecked(f"no encoder graph beside {dec.name} among {[c.name for c in exported.components]}")
    if enc is not None:
        encoder_feed, torch_inputs, label = _encoder_inputs(exported, enc, settings)
        prompt = np.array([[_decoder_start(dec.torch_module)]], dtype=np.int64)
        kwargs: dict[str, Any] = {name: torch.from_numpy(v) for name, v in torch_inputs.items()}
        kwargs["decoder_input_ids"] = torch.from_numpy(prompt)
    else:
        encoder_feed, ids = {}, _prompt_ids(exported, dec, decoder_only=True)
        prompt = np.array([ids], dtype=np.int64)
        label = f"1x{prompt.shape[1]}"
        kwargs = {"input_ids": torch.from_numpy(prompt), "attention_mask": torch.ones_like(torch.from_numpy(prompt))}
    return label, encoder_feed, prompt, kwargs


def _generated(dec: Component, kwargs: dict[str, Any], settings: Settings) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's greedy tokens after the prompt and its logits at every step."""
    import torch
    from transformers import GenerationConfig, GenerationMixin

    model: Any = dec.torch_module
    # Plain greedy: no processors and no EOS stop from the checkpoint's generation config (see the module docstring).
    plain = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=STEPS,
        pad_token_id=_first_int(model.generation_config.pad_token_id, model.generation_config.eos_token_id, 0),
        bos_token_id=model.generation_config.bos_token_id,
        decoder_start_token_id=model.generation_config.decoder_start_token_id,
    )
    if dec.as_loaded is not None:
        dec.as_loaded.restore()
    saved = model.generation_config
    model.generation_config = plain
    try:
        with torch_threads(settings.threads), torch.inference_mode(), _quiet_transformers():
            # GenerationMixin's own loop: some models (whisper) override generate() with their decoding recipe.
            out: Any = GenerationMixin.generate(model, **kwargs, output_logits=True, return_dict_in_generate=True)
    finally:
        model.generation_config = saved
    prompt = kwargs["decoder_input_ids"] if "decoder_input_ids" in kwargs else kwargs["input_ids"]
    tokens = out.sequences[0, prompt.shape[1] :].cpu().numpy().astype(np.int64)
    logits = torch.stack([step[0] for step in out.logits]).float().cpu().numpy()
    return tokens, logits


def _made_ahead(exported: ExportedModel, dec: Component, kwargs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The tokens and logits :func:`reference_ahead` computed, where they are this decoder's on these very inputs.

    Taken, they leave the cache; refused, they stay there (the job's record says they were not taken).
    """
    made = exported.cache.generation_ahead
    if made is None or made.decoder != dec.name or made.inputs != _digest(kwargs):
        return None
    exported.cache.generation_ahead = None
    return made.tokens, made.logits


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """generate() warns about the plain config it is handed (no EOS, pad set): nothing the record needs."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _first_int(*values: Any) -> int:
    for v in values:
        if isinstance(v, int):
            return v
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], int):
            return int(v[0])
    return 0


def _decoder_start(model: Any) -> int:
    for config in (model.generation_config, model.config, getattr(model.config, "decoder", None)):
        start = getattr(config, "decoder_start_token_id", None)
        if isinstance(start, int):
            return start
    raise _NotChecked("the model has no decoder_start_token_id to start generating from")


def _positions(config: Any) -> int | None:
    scopes = [config, getattr(config, "decoder", None), getattr(config, "text_config", None)]
    found = [
        getattr(s, n)
        for s in scopes
        for n in ("n_positions", "max_position_embeddings", "max_target_positions")
        if isinstance(getattr(s, n, None), int)
    ]
    return min(found) if found else None


def _prompt_ids(exported: ExportedModel, comp: Component, *, decoder_only: bool) -> list[int]:
    """The first sentence, tokenized (cut to fit); seeded ids within the vocabulary without a tokenizer."""
    config = getattr(comp.torch_module, "config", None)
    limit = PROMPT_TOKENS
    positions = _positions(config)
    if positions is not None:
        limit = min(limit, positions - (STEPS + 1 if decoder_only else 0))
    if limit < 1:
        raise _NotChecked(f"the position table ({positions}) has no room for a prompt and {STEPS} steps")
    vocab = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None)
    tokenizer = _tokenizer(exported)
    if tokenizer is not None:
        ids = [int(t) for t in tokenizer(SENTENCES[0])["input_ids"]][:limit]
        if ids and (not isinstance(vocab, int) or max(ids) < vocab):
            return ids
    high = vocab if isinstance(vocab, int) and vocab > 0 else 100
    return [int(t) for t in np.random.default_rng(0).integers(0, high, size=min(7, limit))]


def _encoder_inputs(
    exported: ExportedModel, enc: Component, settings: Settings
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """The encoder's ORT feed and PyTorch generate() inputs: verify's batch-1 case, with a real prompt for text."""
    from . import shapes

    found = shapes.verify_shapes(enc.onnx_config, exported.checkpoint.path, settings)
    shape = next((s for s in found if s.batch == 1), None) or (found[0] if found else None)
    if shape is None:
        raise _NotChecked(f"no verify shape to take {enc.name}'s inputs from")
    case = cases(exported, enc, 1, shape.sequence, settings, audio_samples=shape.audio_samples)[Branch.WHOLE]
    feed = dict(case.feed)
    torch_inputs = {k: v.detach().cpu().numpy() for k, v in case.torch_inputs.items() if hasattr(v, "detach")}
    label = case.label
    if "input_ids" in feed and "input_ids" in torch_inputs:
        ids = np.array([_prompt_ids(exported, enc, decoder_only=False)], dtype=np.int64)
        feed["input_ids"] = torch_inputs["input_ids"] = ids
        label = f"1x{ids.shape[1]}"
    # One sequence, as a user sends it: nothing masked (optimum's generated masks have holes); the
    # decoder is handed this mask too (see _encoding).
    for table in (feed, torch_inputs):
        if "attention_mask" in table:
            table["attention_mask"] = np.ones_like(feed.get("input_ids", table["attention_mask"]))
    return feed, torch_inputs, label


def check(
    exported: ExportedModel, artifact: Artifact, comp: Component, settings: Settings, tol: Tolerance
) -> Generation | None:
    """ONNX Runtime's generation with ``artifact``'s decoder against PyTorch's; None when ``comp`` does not generate.

    Raises VerifyError when ONNX Runtime cannot run a step.
    """
    if not settings.verify_generation or comp is not decoder(exported):
        return None
    memo = _memo(exported)
    if not memo.done and not exported.cache.references_done:
        reference(exported, settings)  # verify() run on its own, outside the pipeline: PyTorch's side now
    if memo.reference is None:
        return Generation(note=memo.note or "no PyTorch generation reference was computed")
    ref = memo.reference
    encoder_out: dict[str, np.ndarray] = {}
    if ref.encoder_feed:
        enc = _encoder(exported, comp)
        assert enc is not None  # the reference found it
        path = artifact.files.get(enc.name) or exported.out_dir / "onnx" / variant_files(enc.name, artifact.variant)[0]
        if not path.exists():
            return Generation(note=f"no {artifact.variant} graph of {enc.name} to encode the prompt with")
        # The encoder's own check encoded the prompt already where this is the encoder graph as it ships (optimize).
        encoder_out = exported.cache.encoded.get(path) or encode_prompt(
            session_for(exported, Artifact(artifact.variant, {enc.name: path}), enc, settings), ref.encoder_feed, comp
        )
    session = session_for(exported, artifact, comp, settings)
    unknown = [i.name for i in session.get_inputs() if not _fed(i.name)]
    if unknown:
        return Generation(note=f"{comp.name} has inputs generation does not know how to feed: {unknown}")
    forced = _decode(session, ref, encoder_out, comp, teacher=ref.tokens)
    name = f"{comp.name}/logits" if len(exported.components) > 1 else "logits"

    checks = tuple(
        compare(name, f"{ref.label}/step{i:02d}", ref.logits[i : i + 1], forced[i : i + 1], tol) for i in range(STEPS)
    )
    own = forced.argmax(axis=-1)
    if not np.array_equal(own, ref.tokens):
        # Free-running from here on: ORT's own tokens, on its own cache.
        own = _decode(session, ref, encoder_out, comp, teacher=None).argmax(axis=-1)
    same = own == ref.tokens
    first = None if same.all() else int(np.argmin(same))
    tie = False
    if first is not None:
        step = ref.logits[first]
        # Only a finite tolerance makes two candidates "closer than it" (int8's max abs is unbounded);
        # the bound is the elementwise one at the larger of the two logits.
        best, other = float(step[ref.tokens[first]]), float(step[own[first]])
        bound = tol.max_abs + tol.rtol * max(abs(best), abs(other))
        tie = bool(np.isfinite(tol.max_abs) and best - other <= bound)
    return Generation(STEPS, checks, float(same.mean()), first, tie)


def _fed(name: str) -> bool:
    return name.startswith("past_key_values") or name in (
        "input_ids",
        "attention_mask",
        "position_ids",
        "use_cache_branch",
        "encoder_hidden_states",
        "encoder_attention_mask",
    )


def prompt_feed(exported: ExportedModel, comp: Component) -> dict[str, np.ndarray] | None:
    """The generation check's encoder feed where ``comp`` is the encoder that prompts it; None otherwise."""
    dec = decoder(exported)
    ref = _memo(exported).reference
    if dec is None or dec is comp or ref is None or not ref.encoder_feed or _encoder(exported, dec) is not comp:
        return None
    return ref.encoder_feed


def encoded_from(
    session: InferenceSession, prompt: dict[str, np.ndarray], feed: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray] | None:
    """The prompt's encoding out of a run of the encoder graph on ``feed``, where that feed was the prompt's (verify's
    batch-1 case of an audio encoder is); None where it was not."""
    first = session.get_outputs()[0].name
    same = all(
        i.name in feed and i.name in prompt and feed[i.name].dtype == prompt[i.name].dtype
        and np.array_equal(feed[i.name], prompt[i.name])
        for i in session.get_inputs()
    )  # fmt: skip
    return _encoding(outputs[first], prompt) if same and first in outputs else None


def encode_prompt(session: InferenceSession, feed: dict[str, np.ndarray], comp: Component) -> dict[str, np.ndarray]:
    """The decoder ``comp``'s encoder inputs: the encoder graph's output on the prompt's feed, and its mask."""
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names[:1], _cast(session, feed))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        if is_our_bug(exc):
            raise
        raise VerifyError(f"ONNX Runtime failed on the encoder of {comp.name} while generating: {exc}") from exc
    return _encoding(values[0], feed)


def _encoding(hidden: np.ndarray, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # The decoder is handed the encoder's own mask, as ORTModelForSeq2SeqLM / SpeechSeq2Seq do: a
    # Speech2Text decoder subsamples the frames' mask itself (its encoder output is 4x shorter).
    mask = feed.get("attention_mask")
    return {
        "encoder_hidden_states": hidden,
        "encoder_attention_mask": mask if mask is not None else np.ones(hidden.shape[:2], np.int64),
    }


def _empty_past(session: InferenceSession) -> dict[str, np.ndarray]:
    """Every past of length 0, as ORTModel and transformers.js feed the first step (see ``runtime._empty_past``)."""
    empty = {}
    for spec in session.get_inputs():
        if spec.name.startswith("past_key_values"):
            shape = [d if isinstance(d, int) else 0 if isinstance(d, str) and ("sequence" in d or "past" in d) else 1
                     for d in spec.shape]  # fmt: skip
            empty[spec.name] = np.zeros(shape, dtype=_ORT_FLOAT.get(spec.type, np.float32))
    return empty


def _cast(session: InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feed`` for ``session``: only its inputs, cast to its declared float types (fp16 graphs without fp32 IO)."""
    out = {}
    for spec in session.get_inputs():
        value = feed[spec.name]
        target = _ORT_FLOAT.get(spec.type)
        out[spec.name] = value.astype(target) if target is not None and value.dtype != target else value
    return out


def _decode(
    session: InferenceSession,
    ref: Reference,
    encoder_out: dict[str, np.ndarray],
    comp: Component,
    teacher: np.ndarray | None,
) -> np.ndarray:
    """The last position's logits at each of STEPS steps: the prompt on an empty past, then one token a step.

    ``teacher``: the token fed after each step (PyTorch's); None feeds ORT's own argmax.
    """
    ids = ref.prompt
    past = _empty_past(session)
    output_names = [o.name for o in session.get_outputs()]
    past_len = 0
    found = []
    for step in range(STEPS):
        feed: dict[str, np.ndarray] = {**past, **encoder_out, "input_ids": ids}
        feed["attention_mask"] = np.ones((1, past_len + ids.shape[1]), np.int64)
        feed["position_ids"] = np.arange(past_len, past_len + ids.shape[1], dtype=np.int64)[None]
        feed["use_cache_branch"] = np.array([step > 0])
        try:
            values = dict(zip(output_names, session.run(output_names, _cast(session, feed))))
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            if is_our_bug(exc):
                raise
            raise VerifyError(f"ONNX Runtime failed on {comp.name} at generation step {step}: {exc}") from exc
        logits = np.asarray(values["logits"])[0, -1].astype(np.float32)
        found.append(logits)
        for name, value in values.items():
            if not name.startswith("present"):
                continue
            past_name = "past_key_values" + name.removeprefix("present")
            # On the cache branch a merged decoder passes the cross-attention cache through as a placeholder.
            if step == 0 or ".encoder." not in name:
                past[past_name] = value
        past_len += ids.shape[1]
        token = int(teacher[step]) if teacher is not None else int(logits.argmax())
        ids = np.array([[token]], dtype=np.int64)
    return np.stack(found)
