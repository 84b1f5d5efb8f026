"""Tokenizers for the bundled trainer, all offline.

* ``"byte"``: :class:`ByteTokenizer`, the UTF-8 bytes of the text (ids 0..255) plus one
  end-of-document id 256, so ``vocab_size == 257``. Nothing to train or download; the default.
* a path to a ``tokenizer.json``: :class:`BPETokenizer`, any tokenizer saved by the ``tokenizers``
  library, in particular the ByteLevel BPE that ``hyperwatch data prepare --tokenizer bpe`` trains
  locally (:func:`train_bpe`). Its end-of-document token is ``<|endoftext|>`` (id 0 when trained here).
* ``"vocab:N"``: :class:`VocabOnlyTokenizer`, for pre-tokenized shards whose tokenizer is not at
  hand (e.g. ArchScale's SlimPajama shards made with the Llama-2 tokenizer, ``vocab:32000``):
  training needs only the vocabulary size; it cannot encode text.

Documents are joined with the end-of-document id (:func:`encode_documents`), so a training window
that crosses a document boundary sees the separator, as in GPT-style pre-training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from hyperwatch.trainer.data.errors import DataError

EOS_TOKEN = "<|endoftext|>"
MIN_BPE_VOCAB = 257  # the 256 byte-level symbols plus the end-of-document token


@runtime_checkable
class Tokenizer(Protocol):
    """What the data layer needs from a tokenizer."""

    vocab_size: int
    eos_id: int | None  # the document separator's id, or None when the tokenizer has none
    name: str  # identifies the tokenizer in cache keys and descriptions

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and the document separator as id 256 (vocab 257).

    ``decode`` replaces byte sequences that are not valid UTF-8 (a window cut in the middle of a
    multi-byte character) with U+FFFD and shows the separator as ``<|endoftext|>``.
    """

    vocab_size = 257
    eos_id: int | None = 256
    name = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """The same ids as :meth:`encode`, as a uint16 array, without a Python list in between."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        parts: list[str] = []
        run = bytearray()
        for i in (int(t) for t in ids):
            if 0 <= i < 256:
                run.append(i)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            if i == 256:
                parts.append(EOS_TOKEN)
            else:
                raise DataError(f"ByteTokenizer.decode: id {i} is outside the byte vocabulary 0..256")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class BPETokenizer:
    """A ``tokenizers`` tokenizer loaded from a ``tokenizer.json`` (e.g. one trained by :func:`train_bpe`)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise DataError(
                f"tokenizer {str(path)!r}: no such file; pass 'byte' or the tokenizer.json written by "
                "'hyperwatch data prepare --tokenizer bpe --out DIR' (DIR/tokenizer.json)"
            )
        try:
            self._tok = HFTokenizer.from_file(str(p))
        except Exception as exc:  # the Rust side raises a plain Exception for any parse error
            raise DataError(
                f"tokenizer {p}: not a valid tokenizer.json ({exc}); re-create it with "
                "'hyperwatch data prepare --tokenizer bpe'"
            ) from exc
        self.path = p
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id: int | None = self._tok.token_to_id(EOS_TOKEN)
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        self.name = f"bpe:{digest}"

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))


class VocabOnlyTokenizer:
    """Only a vocabulary size: for pre-tokenized shards when their tokenizer file is not available."""

    eos_id: int | None = None

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 2:
            raise DataError(f"tokenizer 'vocab:{vocab_size}': the vocabulary size must be >= 2")
        self.vocab_size = vocab_size
        self.name = f"vocab:{vocab_size}"

    def encode(self, text: str) -> list[int]:
        raise DataError(f"tokenizer {self.name!r} cannot encode text; use 'byte' or a tokenizer.json for text sources")

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return " ".join(f"<{int(i)}>" for i in ids)


def load_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` -> :class:`ByteTokenizer`; ``"vocab:N"`` -> :class:`VocabOnlyTokenizer`;
    anything else is a path to a ``tokenizer.json`` (or a folder holding one)."""
    if not isinstance(spec, str) or not spec:
        raise DataError(f"tokenizer {spec!r}: expected 'byte', 'vocab:N' or a path to a tokenizer.json")
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("vocab:"):
        size = spec.removeprefix("vocab:")
        if not size.isdigit():
            raise DataError(f"tokenizer {spec!r}: expected 'vocab:N' with N a positive integer, e.g. vocab:32000")
        return VocabOnlyTokenizer(int(size))
    return BPETokenizer(spec)


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str | Path) -> BPETokenizer:
    """Train a ByteLevel BPE locally (``tokenizers`` library) and save it as ``out_path``.

    Byte-level pre-tokenization (GPT-2 style, no prefix space) starts from all 256 byte symbols, so
    any text encodes without an unknown token; ``<|endoftext|>`` is the document separator (id 0).
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_BPE_VOCAB:
        raise DataError(
            f"--vocab-size {vocab_size}: a byte-level BPE needs at least {MIN_BPE_VOCAB} "
            "(256 byte symbols + the separator); use e.g. 8192"
        )
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tok.save(str(tmp))
    tmp.replace(out)
    return BPETokenizer(out)


def encode_documents(tokenizer: Tokenizer, docs: Sequence[str]) -> np.ndarray:
    """All documents as one int64 token array, each followed by the tokenizer's separator (if any)."""
    sep = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    sep_arr = np.asarray(sep, dtype=np.int64)
    parts: list[np.ndarray] = []
    if isinstance(tokenizer, ByteTokenizer):
        for doc in docs:
            parts += [tokenizer.encode_array(doc).astype(np.int64), sep_arr]
    elif isinstance(tokenizer, BPETokenizer):
        step = 256  # documents per encode_batch call: bounded memory, still parallel in Rust
        for i in range(0, len(docs), step):
            for ids in tokenizer.encode_batch(list(docs[i : i + step])):
                parts += [np.asarray(ids, dtype=np.int64), sep_arr]
    else:
        for doc in docs:
            parts += [np.asarray(tokenizer.encode(doc), dtype=np.int64), sep_arr]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)
