"""The trainer's data layer: configuration, corpora and their on-disk token cache.

``load_corpus(DataConfig(...))`` gives a :class:`Corpus`: 1-D integer token arrays for training
and validation plus the vocabulary size. Sources, all offline:

* ``stdlib`` (default): the Python standard library's ``.py`` files (exists on every machine);
* ``text``: one text file, or every file of a folder (each file a document);
* ``jsonl``: a ``.jsonl`` file or a folder of them, the text in ``text_field``;
* ``packed``: a folder of LitGPT ``LITPKDS`` files ``train*.bin`` / ``validation*.bin``, as ArchScale
  and ``hyperwatch data prepare`` write them; read with memmap, nothing cached.

Text sources are tokenized once and cached under ``cache_dir`` as one LITPKDS file whose name is a
hash of everything that decides its content (source, resolved root, every file's path, size and
mtime, text field, byte cap, tokenizer identity), so an edited corpus or another tokenizer gets a
new entry. Writers take a per-entry file lock and publish with ``os.replace``: concurrent processes
(the ranks of a torchrun job, the runs of a sweep) tokenize once and never see a half-written file.
Sources without their own validation split hold out the last ``val_fraction`` of the tokens.

Re-exported here for the training loop: :class:`TokenLoader`, :func:`iter_eval_batches`,
:func:`load_tokenizer`, :class:`Tokenizer`, :class:`DataError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hyperwatch.trainer.data.config import SOURCES, DataConfig
from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.loader import TokenLoader, iter_eval_batches
from hyperwatch.trainer.data.packed import (
    find_packed_files,
    read_header,
    read_packed,
    read_packed_files,
    token_dtype,
    write_packed,
)
from hyperwatch.trainer.data.sources import list_source_files, read_documents
from hyperwatch.trainer.data.tokenizer import Tokenizer, encode_documents, load_tokenizer

__all__ = [
    "SOURCES",
    "Corpus",
    "DataConfig",
    "DataError",
    "TokenLoader",
    "Tokenizer",
    "iter_eval_batches",
    "load_corpus",
    "load_tokenizer",
]

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the cached token layout changes


@dataclass
class Corpus:
    train: np.ndarray  # 1-D integer token ids (possibly a read-only memmap)
    val: np.ndarray  # 1-D held-out token ids
    vocab_size: int
    description: str
    tokenizer: Tokenizer | None = None


def load_corpus(cfg: DataConfig) -> Corpus:
    """Tokens of the configured source, split into train and validation."""
    tok = load_tokenizer(cfg.tokenizer)
    if cfg.source == "packed":
        return _load_packed(cfg, tok)
    tokens, description = _cached_text_tokens(cfg, tok)
    train, val = _split_tail(tokens, cfg.val_fraction, description)
    desc = f"{description}; {train.shape[0]:,} train + {val.shape[0]:,} val tokens (last {cfg.val_fraction:g})"
    return Corpus(train=train, val=val, vocab_size=tok.vocab_size, description=desc, tokenizer=tok)


def _split_tail(tokens: np.ndarray, fraction: float, what: str) -> tuple[np.ndarray, np.ndarray]:
    n = int(tokens.shape[0])
    n_val = max(1, round(n * fraction))
    if n - n_val < 2:
        raise DataError(f"{what}: only {n} tokens, too few to hold out {fraction:g}; use a larger corpus")
    return tokens[: n - n_val], tokens[n - n_val :]


def _check_ids(tokens: np.ndarray, vocab_size: int, files: list[Path], tok: Tokenizer, folder: str) -> None:
    """Every id must index the embedding: fail here rather than with an opaque index error later."""
    if tokens.size == 0:
        return
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo >= 0 and hi < vocab_size:
        return
    hint = f"pass tokenizer='vocab:{hi + 1}' or larger, or the tokenizer.json that made the shards"
    if (Path(folder) / "tokenizer.json").is_file():
        hint = f"pass tokenizer='{Path(folder) / 'tokenizer.json'}' (the tokenizer that made the shards)"
    names = ", ".join(f.name for f in files[:3]) + (", ..." if len(files) > 3 else "")
    raise DataError(
        f"{folder} ({names}): token ids span {lo}..{hi} but tokenizer {tok.name!r} has vocab_size {vocab_size}; {hint}"
    )


def _load_packed(cfg: DataConfig, tok: Tokenizer) -> Corpus:
    assert cfg.path is not None
    train_files, val_files = find_packed_files(cfg.path)
    train = read_packed_files(train_files)
    _check_ids(train, tok.vocab_size, train_files, tok, cfg.path)
    if val_files:
        val = read_packed_files(val_files)
        _check_ids(val, tok.vocab_size, val_files, tok, cfg.path)
        split = f"{len(val_files)} validation files"
    else:
        train, val = _split_tail(train, cfg.val_fraction, cfg.path)
        split = f"last {cfg.val_fraction:g} held out"
    if train.shape[0] < 2:
        raise DataError(f"{cfg.path}: the train*.bin files hold {train.shape[0]} tokens; the corpus is empty")
    desc = (
        f"packed corpus at {cfg.path}: {len(train_files)} train files, {split}; tokenizer {tok.name} "
        f"(vocab {tok.vocab_size}); {train.shape[0]:,} train + {val.shape[0]:,} val tokens"
    )
    return Corpus(train=train, val=val, vocab_size=tok.vocab_size, description=desc, tokenizer=tok)


def cache_key(cfg: DataConfig, tok: Tokenizer) -> str:
    """Hash of everything that decides a text corpus's tokens (not the val split: done at load)."""
    root, files = list_source_files(cfg.source, cfg.path)
    listing = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue  # vanished or unreadable: the reader skips (stdlib) or reports it
        listing.append([f.relative_to(root).as_posix() if f != root else f.name, st.st_size, st.st_mtime_ns])
    ident: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "source": cfg.source,
        "root": str(root.resolve()),
        "text_field": cfg.text_field if cfg.source == "jsonl" else None,
        "max_bytes": cfg.max_bytes,
        "tokenizer": tok.name,
        "files": listing,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX flock); elsewhere a no-op, atomic renames still protect readers."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_cache(bin_path: Path, meta_path: Path) -> tuple[np.ndarray, str] | None:
    if not (bin_path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        header = read_header(bin_path)
        if meta.get("tokens") != header.chunk_size or not isinstance(meta.get("description"), str):
            raise DataError(f"{meta_path}: does not match {bin_path.name}")
        return read_packed(bin_path), meta["description"]
    except (DataError, OSError, json.JSONDecodeError) as exc:
        log.warning("data cache entry %s is unusable (%s); rebuilding it", bin_path, exc)
        return None


def _cached_text_tokens(cfg: DataConfig, tok: Tokenizer) -> tuple[np.ndarray, str]:
    cache = Path(cfg.cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"DataConfig.cache_dir: cannot create {cache} ({exc.strerror}); choose a writable folder"
        ) from exc
    stem = f"{cfg.source}-{cache_key(cfg, tok)}"
    bin_path, meta_path = cache / f"{stem}.bin", cache / f"{stem}.json"
    hit = _read_cache(bin_path, meta_path)
    if hit is not None:
        return hit
    with _locked(cache / f"{stem}.lock"):
        hit = _read_cache(bin_path, meta_path)  # another process may have written it while we waited
        if hit is not None:
            return hit
        docs = read_documents(cfg.source, cfg.path, cfg.text_field, cfg.max_bytes)
        tokens = encode_documents(tok, docs.texts)
        description = f"{docs.describe(cfg.source)}; tokenizer {tok.name} (vocab {tok.vocab_size})"
        meta = {"tokens": int(tokens.shape[0]), "description": description, "documents": len(docs.texts)}
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".json", dir=cache)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(meta, fh)
        os.replace(tmp, meta_path)
        write_packed(bin_path, tokens, token_dtype(tok.vocab_size))  # the .bin lands last: the commit
        log.info("tokenized %s into %s (%d tokens)", description, bin_path, tokens.shape[0])
    return read_packed(bin_path), description
