"""Every loading claim of a model card runs: its snippets, copied from the card, load the artifact folder.

The zoo models the card used to get wrong are converted by the real pipeline and recorded in a real
results DB; their cards are read back from it as publish renders them, and each code block is run as
it is (tests/snippets.py: the repo id is a folder of the working directory), optimum's classes in
Python and transformers.js in node. The conversions check every variant on ort-cpu, openvino and
transformers.js: the card's "Runs in" and its transformers.js claims are those recorded rows.
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
from zoo_convert.store.queries import query

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

# CTC speech models (one graph), an encoder-decoder exported without past, a Diffusers pipeline, an
# encoder-decoder with a merged decoder, and a plain encoder for the transformers.js side.
MODELS = ("wav2vec2", "unispeech-sat", "wav2vec2-conformer", "encoder-decoder", "stable-diffusion", "t5", "bert")
TARGETS = ("ort-cpu", "openvino", "transformers.js")


@dataclasses.dataclass
class Cards:
    root: Path  # the working directory where each repo id is a folder
    cards: dict[str, str]  # zoo name -> card text
    candidates: dict[str, Candidate]
    store: ResultStore


def _repo(name: str) -> str:
    return f"acme/{name}-ONNX"


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> Cards:
    from zoo_convert import zoo

    tmp = tmp_path_factory.mktemp("card-snippets")
    manifest = read_manifest(zoo.build(tmp / "zoo", only=MODELS))
    settings = Settings(out_dir=str(tmp / "artifacts"), benchmark=False, targets=TARGETS)
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
    return Cards(root, {n: model_card(c, _repo(n)) for n, c in candidates.items()}, candidates, store)


def _passed_on(cards: Cards, target: str) -> set[str]:
    """The models whose transformers.js (or other) target rows passed, read from the DB itself."""
    _, rows = query(cards.store, "SELECT DISTINCT job_key FROM target_results WHERE target = ? AND status = 'passed'",
                    [target])  # fmt: skip
    return {r[0] for r in rows}


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


def test_runs_in_lists_the_targets_that_passed_with_their_versions(cards: Cards) -> None:
    _, rows = query(cards.store, "SELECT job_key, target, any_value(target_version), list(variant ORDER BY variant)"
                                 " FROM target_results WHERE status = 'passed' GROUP BY ALL")  # fmt: skip
    assert {(k, t) for k, t, *_ in rows} >= {("bert", "openvino"), ("bert", "transformers.js"), ("t5", "ort-cpu")}
    for job_key, target, version, variants in rows:
        card = cards.cards[job_key]
        runs_in = card.split("## Runs in")[1].split("## Usage")[0]
        order = {"fp32": 0, "int8": 1}
        listed = ", ".join(sorted(variants, key=order.__getitem__))
        assert f"| {target} | {version} | {listed} |" in runs_in, (job_key, runs_in)
    # what was checked and did not pass is said, never listed as running
    _, none_passed = query(cards.store, "SELECT job_key, target FROM target_results GROUP BY ALL"
                                        " HAVING bool_and(status <> 'passed')")  # fmt: skip
    assert none_passed  # wav2vec2-conformer on transformers.js at least
    for job_key, target in none_passed:
        runs_in = cards.cards[job_key].split("## Runs in")[1].split("## Usage")[0]
        assert f"| {target} |" not in runs_in and "Checked, not passed: " in runs_in and f"{target}: fp32 " in runs_in
    conformer = cards.cards["wav2vec2-conformer"]
    assert "| transformers.js |" not in conformer and "transformers.js: fp32 unsupported, int8 unsupported" in conformer


def test_transformers_js_is_claimed_only_where_its_target_passed(cards: Cards) -> None:
    """The tag and the section follow the transformers.js target's rows, not a list of model types; the section's
    code is the load that target ran. Its pipeline() line needs more (the tokenizer, a task class): wav2vec2's
    checkpoint has vocab.json only, so its card shows the model load the target ran and no pipeline."""
    from huggingface_hub import ModelCard

    passed = _passed_on(cards, "transformers.js")
    assert passed == {"bert", "t5", "wav2vec2", "unispeech-sat"}, passed  # encoder-decoder, wav2vec2-conformer: unsupported
    for name, text in cards.cards.items():
        card = ModelCard(text)
        claimed = "transformers.js" in (card.data.tags or [])
        assert claimed == (name in passed) and ("```js" in card.text) == (name in passed), name
        if name in passed:
            assert f"const model = await AutoModel.from_pretrained('{_repo(name)}', {{ dtype: 'fp32' }});" in text, name
    for name in ("wav2vec2", "unispeech-sat"):
        assert not Path(str(cards.candidates[name].artifacts_dir), "tokenizer.json").exists()
        assert "pipeline(" not in cards.cards[name], name
    assert "const pipe = await pipeline(" in cards.cards["bert"] and "const pipe = await pipeline(" in cards.cards["t5"]


def test_every_transformers_js_snippet_of_the_cards_runs_in_node(cards: Cards) -> None:
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the transformers.js checks need it (`make node-deps` installs it)")
    if not (Path(__file__).parent / "js" / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed in tests/js/node_modules: run `make node-deps`")
    pieces = [s for name, card in cards.cards.items() for s in snippets(card, _repo(name)) if s.language == "js"]
    # every dtype of its table, each: the models whose transformers.js target passed
    assert {p.repo_id for p in pieces} == {_repo(n) for n in _passed_on(cards, "transformers.js")}
    failed = [(p.repo_id, p.label, error) for p, error in zip(pieces, run_js(node, cards.root, pieces)) if error]
    assert failed == []
