"""Tokenizers: byte (default), a BPE trained here with a tiny vocabulary, vocab-only; and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    VocabOnlyTokenizer,
    encode_documents,
    load_tokenizer,
    train_bpe,
)

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "naïve café, 数据, emoji 🙂\n",
] * 20


def test_byte_tokenizer_round_trips_unicode() -> None:
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    text = "naïve 🙂"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode([*ids, 256, 104, 105]) == text + "<|endoftext|>hi"
    assert tok.decode(ids[:-1]).endswith("\ufffd")  # a window cut inside a character
    with pytest.raises(DataError, match="id 300 is outside"):
        tok.decode([300])


def test_encode_documents_puts_the_separator_after_each_document() -> None:
    tok = ByteTokenizer()
    ids = encode_documents(tok, ["ab", "é"])
    assert ids.tolist() == [97, 98, 256, 0xC3, 0xA9, 256]
    assert encode_documents(tok, []).size == 0


def test_bpe_trains_locally_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "tok" / "tokenizer.json"
    tok = train_bpe(TEXTS, vocab_size=300, out_path=path)
    assert path.is_file()
    assert tok.vocab_size == 300 and tok.eos_id == 0
    for text in TEXTS[:3]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert max(ids) < 300
    # merges were learnt: fewer tokens than bytes on text like the training text
    assert len(tok.encode(TEXTS[1])) < len(TEXTS[1].encode("utf-8"))
    joined = encode_documents(tok, TEXTS[:2])
    assert joined.tolist() == [*tok.encode(TEXTS[0]), 0, *tok.encode(TEXTS[1]), 0]
    again = load_tokenizer(str(path))
    assert isinstance(again, BPETokenizer) and again.name == tok.name and again.name.startswith("bpe:")
    assert load_tokenizer(str(path.parent)).encode("hello") == tok.encode("hello")  # a folder works too


def test_bpe_vocab_too_small(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--vocab-size 100: a byte-level BPE needs at least 257"):
        train_bpe(TEXTS, vocab_size=100, out_path=tmp_path / "t.json")


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing.json"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer", encoding="utf-8")
    with pytest.raises(DataError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(str(bad))
    with pytest.raises(DataError, match="vocab:N"):
        load_tokenizer("vocab:abc")
    with pytest.raises(DataError, match="expected 'byte'"):
        load_tokenizer("")


def test_vocab_only_tokenizer_for_pretokenized_shards() -> None:
    tok = load_tokenizer("vocab:32000")
    assert isinstance(tok, VocabOnlyTokenizer) and tok.vocab_size == 32000 and tok.eos_id is None
    assert tok.decode(np.array([1, 2])) == "<1> <2>"
    with pytest.raises(DataError, match="cannot encode text"):
        tok.encode("hi")
