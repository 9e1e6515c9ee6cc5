"""Tokenizers for the zoo, learned from a fixed synthetic English corpus.

Four algorithms cover the zoo's models: WordPiece (bert-likes), byte-level BPE
(gpt2, roberta, clip, whisper), sentencepiece-style BPE (llama) and Unigram (t5,
albert, xlm-roberta), each wrapped in the model's own fast tokenizer class. The
vocabularies are learned here in plain Python, so every build writes the same files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

SEED = 0
VOCAB_SIZE = 1000

_WORDS = """
the of and to in is was that for on with as by at from his her they this which be
are have had not but were all one an or their there been has would who will more
when time if no out so up what about into than them can only other new some could
these two may first then do any like my now over such our man me even most made
after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came
right used take three small large house home water light river city country place
north south east west morning evening night summer winter spring autumn garden
mountain forest island ocean bridge station market school library window kitchen
table chair letter story music picture question answer number reason moment friend
family mother father brother sister children teacher doctor farmer writer painter
quickly slowly quietly happily carefully suddenly together always sometimes often
walk run read write sing speak listen think believe remember understand travel
build open close begin finish carry bring follow return change improve measure
bright dark warm cold quiet loud simple strange beautiful important different
possible natural careful gentle ancient modern famous common private public
river's children's model models convert converted converting conversion export
exported exporting tensor tensors matrix vector layer layers network networks
language translation sentence sentences token tokens vocabulary encoder decoder
attention transformer image images audio sound signal frequency camera picture
"""


def corpus(lines: int = 2000) -> list[str]:
    """A fixed synthetic English corpus: the same sentences on every call."""
    words = _WORDS.split()
    rng = random.Random(SEED)
    out = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ","]))
    return out


@dataclass(frozen=True)
class TokenizerSpec:
    """How to make one tokenizer.

    Attributes:
        algo: ``wordpiece`` (bert-likes), ``bytelevel`` (gpt2/roberta-likes byte-level BPE),
            ``metaspace-bpe`` (llama-style sentencepiece BPE) or ``unigram`` (t5-style sentencepiece).
        specials: special tokens, given the first ids in this order.
        cls: the transformers fast tokenizer class it is saved as.
        roles: tokenizer role (``pad_token``, ``bos_token``, ...) -> special token.
        kwargs: extra constructor arguments of ``cls``.
    """

    algo: str
    specials: tuple[str, ...]
    cls: str
    roles: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, object] = field(default_factory=dict)


_BERT_ROLES = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_ROBERTA_ROLES = {
    "bos_token": "<s>",
    "pad_token": "<pad>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "cls_token": "<s>",
    "sep_token": "</s>",
}
_ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
_GPT2_ROLES = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
_LLAMA_ROLES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
_T5_ROLES = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def wordpiece(cls: str = "BertTokenizerFast") -> TokenizerSpec:
    """A bert-style lower-cased WordPiece tokenizer saved as ``cls``."""
    return TokenizerSpec("wordpiece", _BERT_SPECIALS, cls, _BERT_ROLES)


def roberta_bpe(cls: str = "RobertaTokenizerFast") -> TokenizerSpec:
    """A roberta/bart-style byte-level BPE tokenizer saved as ``cls``."""
    return TokenizerSpec("bytelevel", _ROBERTA_SPECIALS, cls, _ROBERTA_ROLES)


def gpt2_bpe(cls: str = "GPT2TokenizerFast", **roles: str) -> TokenizerSpec:
    """A gpt2-style byte-level BPE tokenizer (one ``<|endoftext|>`` special) saved as ``cls``."""
    return TokenizerSpec("bytelevel", ("<|endoftext|>",), cls, {**_GPT2_ROLES, **roles})


def llama_bpe(cls: str = "LlamaTokenizerFast", **roles: str) -> TokenizerSpec:
    """A llama-style sentencepiece BPE tokenizer saved as ``cls``."""
    return TokenizerSpec("metaspace-bpe", ("<unk>", "<s>", "</s>"), cls, {**_LLAMA_ROLES, **roles})


def t5_unigram(cls: str = "T5TokenizerFast", **kwargs: object) -> TokenizerSpec:
    """A t5-style sentencepiece Unigram tokenizer saved as ``cls``."""
    return TokenizerSpec("unigram", ("<pad>", "</s>", "<unk>"), cls, _T5_ROLES, kwargs)


def bert_unigram(cls: str) -> TokenizerSpec:
    """A sentencepiece Unigram tokenizer with bert's special tokens (albert, deberta-v2)."""
    return TokenizerSpec("unigram", _BERT_SPECIALS, cls, _BERT_ROLES)


def bert_bytelevel(cls: str) -> TokenizerSpec:
    """A byte-level BPE tokenizer with bert's special tokens (modernbert)."""
    return TokenizerSpec("bytelevel", _BERT_SPECIALS, cls, _BERT_ROLES)


def roberta_unigram(cls: str, **kwargs: object) -> TokenizerSpec:
    """A sentencepiece Unigram tokenizer with roberta's special tokens (xlm-roberta, camembert)."""
    return TokenizerSpec("unigram", _ROBERTA_SPECIALS, cls, _ROBERTA_ROLES, kwargs)


def clip_bpe() -> TokenizerSpec:
    """A byte-level BPE tokenizer with CLIP's start/end tokens."""
    specials = ("<|startoftext|>", "<|endoftext|>")
    roles = {"bos_token": specials[0], "eos_token": specials[1], "unk_token": specials[1], "pad_token": specials[1]}
    return TokenizerSpec("bytelevel", specials, "CLIPTokenizerFast", roles)


def whisper_bpe() -> TokenizerSpec:
    """A byte-level BPE tokenizer with the whisper control tokens generation needs."""
    specials = (
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|transcribe|>",
        "<|translate|>",
        "<|notimestamps|>",
    )
    roles = {"bos_token": specials[0], "eos_token": specials[0], "unk_token": specials[0], "pad_token": specials[0]}
    return TokenizerSpec("bytelevel", specials, "WhisperTokenizerFast", roles)


def make_tokenizer(spec: TokenizerSpec) -> PreTrainedTokenizerFast:
    """A fast tokenizer of class ``spec.cls`` over a vocabulary learned from :func:`corpus`."""
    import transformers
    from tokenizers import Tokenizer

    cls: type[PreTrainedTokenizerFast] = getattr(transformers, spec.cls)
    backend = Tokenizer.from_str(_trained_json(spec.algo, spec.specials, spec.roles["unk_token"]))
    return cls(tokenizer_object=backend, **spec.roles, **spec.kwargs)


@cache
def _trained_json(algo: str, specials: tuple[str, ...], unk: str) -> str:
    """Build once per (algorithm, specials) and keep the serialized tokenizer.

    The vocabularies are learned here in plain Python rather than with the
    ``tokenizers`` trainers, whose tie-breaking follows hash order and so
    changes the vocabulary from one process to the next.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if algo == "wordpiece":
        normalizer = normalizers.BertNormalizer(lowercase=True)
        pre = pre_tokenizers.BertPreTokenizer()
        counts = _pre_token_counts(pre, normalizer)
        chars = sorted({c for word in counts for c in word})
        words = [w for w in sorted(counts, key=lambda w: (-counts[w], w)) if len(w) > 1]
        tokens = list(specials) + chars + ["##" + c for c in chars] + words
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens[:VOCAB_SIZE])}, unk_token=unk))
        tok.normalizer = normalizer
        tok.pre_tokenizer = pre
        tok.decoder = decoders.WordPiece()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tokens.index("[CLS]")), ("[SEP]", tokens.index("[SEP]"))],
        )
    elif algo == "bytelevel":
        # CLIPTokenizerFast insists on a Sequence here.
        pre = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False)])
        vocab, merges = _bpe_vocab("bytelevel", specials)
        tok = Tokenizer(models.BPE(vocab, merges))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif algo in ("metaspace-bpe", "unigram"):
        pre = _metaspace()
        vocab, merges = _bpe_vocab("metaspace", specials)
        if algo == "unigram":
            # The BPE pieces with scores falling by rank: Viterbi then favours long, early pieces.
            pieces = sorted(vocab, key=vocab.__getitem__)
            scored = [(p, 0.0 if p in specials else -1.0 - i / len(pieces)) for i, p in enumerate(pieces)]
            tok = Tokenizer(models.Unigram(scored, unk_id=pieces.index(unk)))
        else:
            tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        raise ValueError(f"unknown tokenizer algorithm {algo!r}")
    tok.add_special_tokens(list(specials))
    serialized: str = tok.to_str()
    return serialized


def _pre_token_counts(pre: pre_tokenizers.PreTokenizer, normalizer: normalizers.Normalizer | None = None) -> dict[str, int]:
    """How often each pre-token (word piece before the model splits it) occurs in the corpus."""
    counts: dict[str, int] = {}
    for line in corpus():
        text = normalizer.normalize_str(line) if normalizer is not None else line
        for word, _ in pre.pre_tokenize_str(text):
            counts[word] = counts.get(word, 0) + 1
    return counts


def _metaspace() -> pre_tokenizers.Metaspace:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")


def _bpe_vocab(pre: str, specials: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Specials, then the alphabet, then merged tokens until the vocabulary holds VOCAB_SIZE tokens."""
    alphabet, all_merges = _learn_bpe(pre)
    vocab = list(specials) + [c for c in alphabet if c not in specials]
    seen = set(vocab)
    merges: list[tuple[str, str]] = []
    for a, b in all_merges:
        if len(vocab) >= VOCAB_SIZE:
            break
        merges.append((a, b))
        if a + b not in seen:  # two different merges can spell the same token
            seen.add(a + b)
            vocab.append(a + b)
    return {t: i for i, t in enumerate(vocab)}, merges


@cache
def _learn_bpe(pre: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The alphabet and up to VOCAB_SIZE byte-pair merges, ties broken by the pair's text so they never vary."""
    from tokenizers import pre_tokenizers

    if pre == "bytelevel":
        counts = _pre_token_counts(pre_tokenizers.ByteLevel(add_prefix_space=False))
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    else:
        counts = _pre_token_counts(_metaspace())
        alphabet = sorted({c for word in counts for c in word})
    words = {tuple(w): c for w, c in counts.items()}
    merges: list[tuple[str, str]] = []
    while len(merges) < VOCAB_SIZE:
        pairs: dict[tuple[str, str], int] = {}
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        words = {_merge(word, best): count for word, count in words.items()}
    return alphabet, merges


def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


