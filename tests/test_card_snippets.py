"""Every loading claim of a model card runs: its snippets, copied from the card, load the artifact folder.

The zoo models the card used to get wrong are converted by the real pipeline and recorded in a real
results DB; their cards are read back from it as publish renders them, and each code block is run as
it is (tests/snippets.py: the repo id is a folder of the working directory), optimum's classes in
Python and transformers.js in node.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from snippets import run_js, run_python, snippets, workspace

from zoo_convert.manifest import read_manifest
from zoo_convert.pipeline import convert_one
from zoo_convert.publish.candidates import Candidate, load_candidates
from zoo_convert.publish.card import model_card
from zoo_convert.records import Settings
from zoo_convert.store import ResultStore

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

# CTC speech models (one graph), an encoder-decoder exported without past, a Diffusers pipeline, an
# encoder-decoder with a merged decoder, and a plain encoder for the transformers.js side.
MODELS = ("wav2vec2", "unispeech-sat", "wav2vec2-conformer", "encoder-decoder", "stable-diffusion", "t5", "bert")


@dataclasses.dataclass
class Cards:
    root: Path  # the working directory where each repo id is a folder
    cards: dict[str, str]  # zoo name -> card text
    candidates: dict[str, Candidate]


def _repo(name: str) -> str:
    return f"acme/{name}-ONNX"


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> Cards:
    from zoo_convert import zoo

    tmp = tmp_path_factory.mktemp("card-snippets")
    manifest = read_manifest(zoo.build(tmp / "zoo", only=MODELS))
    settings = Settings(out_dir=str(tmp / "artifacts"), benchmark=False)
    store = ResultStore(tmp / "results.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    for entry in manifest.entries:
        entry = dataclasses.replace(entry, variants=("fp32", "int8"))
        result = convert_one(entry, settings)
        assert result.passed and not result.partial, (entry.source, result.message)
        store.record("r", Path(entry.source).name, result)
    store.finish_run("r")
    candidates = {Path(c.source).name: c for c in load_candidates(store, "r")}
    assert set(candidates) == set(MODELS)
    root = workspace(tmp / "work", {_repo(n): str(c.artifacts_dir) for n, c in candidates.items()})
    return Cards(root, {n: model_card(c, _repo(n)) for n, c in candidates.items()}, candidates)


def test_every_optimum_snippet_of_the_cards_loads_its_folder(cards: Cards) -> None:
    pieces = [s for name, card in cards.cards.items() for s in snippets(card, _repo(name)) if s.language == "python"]
    failed = [(p.repo_id, p.label, error) for p, error in zip(pieces, run_python(cards.root, pieces)) if error]
    assert failed == []
    # the shown load of every card, and the int8 line of every card whose class picks a variant by file name
    assert len(pieces) >= 2 * len(MODELS) - 1, [(p.repo_id, p.label) for p in pieces]


def test_the_cards_name_the_class_that_loads_each_kind_of_model(cards: Cards) -> None:
    for ctc in ("wav2vec2", "unispeech-sat", "wav2vec2-conformer"):
        assert f"model = ORTModelForCTC.from_pretrained(\"{_repo(ctc)}\", subfolder=\"onnx\")" in cards.cards[ctc]
        assert "ORTModelForSpeechSeq2Seq" not in cards.cards[ctc]
    no_past = cards.cards["encoder-decoder"]
    assert f'ORTModelForSeq2SeqLM.from_pretrained("{_repo("encoder-decoder")}", subfolder="onnx", use_cache=False)' in no_past
    sd = cards.cards["stable-diffusion"]
    assert f'model = ORTDiffusionPipeline.from_pretrained("{_repo("stable-diffusion")}")' in sd
    assert 'subfolder="onnx"' not in sd
    t5 = cards.cards["t5"]
    assert 'encoder_file_name="encoder_model_quantized.onnx", decoder_file_name="decoder_model_merged_quantized.onnx"' in t5


def test_transformers_js_is_claimed_only_where_its_pipeline_finds_a_tokenizer(cards: Cards) -> None:
    """wav2vec2's checkpoint has vocab.json only: transformers.js's ASR pipeline cannot load it, so no claim."""
    from huggingface_hub import ModelCard

    for name in ("wav2vec2", "unispeech-sat", "wav2vec2-conformer"):
        card = ModelCard(cards.cards[name])
        assert not Path(str(cards.candidates[name].artifacts_dir), "tokenizer.json").exists()
        assert "transformers.js" not in (card.data.tags or []) and "```js" not in card.text, name
    assert "```js" in cards.cards["bert"] and "```js" in cards.cards["t5"]


def test_every_transformers_js_snippet_of_the_cards_runs_in_node(cards: Cards) -> None:
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the transformers.js checks need it (`make node-deps` installs it)")
    if not (Path(__file__).parent / "js" / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed in tests/js/node_modules: run `make node-deps`")
    pieces = [s for name, card in cards.cards.items() for s in snippets(card, _repo(name)) if s.language == "js"]
    assert {p.repo_id for p in pieces} == {_repo("bert"), _repo("t5")}  # every dtype of its table, each
    failed = [(p.repo_id, p.label, error) for p, error in zip(pieces, run_js(node, cards.root, pieces)) if error]
    assert failed == []
