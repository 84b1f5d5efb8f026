"""``hyperwatch data``: prepare token shards offline.

``hyperwatch data prepare --source {stdlib,text,jsonl} [--path P] --out DIR [--tokenizer byte|bpe]``
reads the text, trains a ByteLevel BPE locally when asked (``DIR/tokenizer.json``), tokenizes every
document followed by the end-of-document id, holds out the last ``--val-fraction`` of the tokens and
writes LitGPT packed files ``DIR/train_000.bin ...`` and ``DIR/validation_000.bin ...`` (uint16 when
the vocabulary fits, else int32), then prints a JSON summary. Train with them through
``DataConfig(source="packed", path=DIR, tokenizer="DIR/tokenizer.json")`` (``tokenizer="byte"`` for
byte shards).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.sources import TEXT_SOURCES, read_documents

SUMMARY_FILE = "prepare.json"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _max_bytes(text: str) -> int | None:
    if text.lower() in ("all", "none", "0"):
        return None
    return _positive_int(text)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} must lie strictly between 0 and 1")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Prepare token data offline.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser(
        "prepare",
        help="tokenize a text corpus into LITPKDS shards (optionally training a BPE tokenizer)",
        description="Read text offline, optionally train a ByteLevel BPE (DIR/tokenizer.json), and write "
        "LitGPT LITPKDS shards DIR/train_NNN.bin and DIR/validation_NNN.bin plus DIR/prepare.json.",
    )
    p.add_argument("--source", choices=TEXT_SOURCES, default="stdlib", help="text source (default: stdlib)")
    p.add_argument("--path", help="file or folder for --source text/jsonl")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument("--out", required=True, help="output folder for the shards and tokenizer.json")
    p.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte", help="byte (vocab 257) or bpe")
    p.add_argument("--vocab-size", type=_positive_int, default=8192, help="BPE vocabulary size (default 8192)")
    p.add_argument("--val-fraction", type=_fraction, default=0.05, help="held-out tail of the tokens (default 0.05)")
    p.add_argument(
        "--chunk-tokens", type=_positive_int, default=4_194_304, help="tokens per .bin file (default 4194304)"
    )
    p.add_argument(
        "--max-bytes",
        type=_max_bytes,
        default=8_000_000,
        help="cap on raw text read, in bytes; 'all' reads everything (default 8000000)",
    )
    p.add_argument("--force", action="store_true", help="replace shards already in --out")
    return parser


def prepare(
    *,
    source: str,
    out: str | Path,
    path: str | None = None,
    text_field: str = "text",
    tokenizer: str = "byte",
    vocab_size: int = 8192,
    val_fraction: float = 0.05,
    chunk_tokens: int = 4_194_304,
    max_bytes: int | None = 8_000_000,
    force: bool = False,
) -> dict[str, Any]:
    """Write ``out/{train,validation}_NNN.bin`` (and ``out/tokenizer.json`` for bpe); return the summary."""
    import numpy as np  # numpy and the tokenizers load here, not for --help

    from hyperwatch.trainer.data.packed import token_dtype, write_shards
    from hyperwatch.trainer.data.tokenizer import MIN_BPE_VOCAB, ByteTokenizer, Tokenizer, encode_documents, train_bpe

    if source not in TEXT_SOURCES:
        raise DataError(f"--source {source!r}: choose one of {', '.join(TEXT_SOURCES)}")
    if tokenizer not in ("byte", "bpe"):
        raise DataError(f"--tokenizer {tokenizer!r}: choose 'byte' or 'bpe'")
    if source != "stdlib" and path is None:
        raise DataError(f"--path: --source {source} needs a file or folder")
    if source == "stdlib" and path is not None:
        raise DataError("--path: --source stdlib reads the standard library; drop --path or use --source text")
    if tokenizer == "bpe" and vocab_size < MIN_BPE_VOCAB:
        raise DataError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least {MIN_BPE_VOCAB}")
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"--val-fraction {val_fraction}: must lie strictly between 0 and 1")
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {out_dir}: exists and is not a folder; choose another output folder")
    old = sorted([*out_dir.glob("train*.bin"), *out_dir.glob("validation*.bin")]) if out_dir.is_dir() else []
    if old and not force:
        raise DataError(
            f"--out {out_dir}: already holds {len(old)} shard files ({old[0].name}, ...); "
            "choose an empty folder or pass --force to replace them"
        )
    docs = read_documents(source, path, text_field, max_bytes)
    tok: Tokenizer = (
        train_bpe(docs.texts, vocab_size, out_dir / "tokenizer.json") if tokenizer == "bpe" else ByteTokenizer()
    )
    tokens = encode_documents(tok, docs.texts)
    n_val = max(1, round(tokens.shape[0] * val_fraction))
    if tokens.shape[0] - n_val < 2:
        raise DataError(f"--val-fraction {val_fraction}: the corpus has only {tokens.shape[0]} tokens")
    for f in old:
        f.unlink()
    dtype = token_dtype(tok.vocab_size)
    train_files = write_shards(out_dir, "train", tokens[:-n_val], chunk_tokens, dtype)
    val_files = write_shards(out_dir, "validation", tokens[-n_val:], chunk_tokens, dtype)
    summary: dict[str, Any] = {
        "out": str(out_dir),
        "source": source,
        "path": path,
        "documents": len(docs.texts),
        "text_bytes": docs.n_bytes,
        "truncated": docs.truncated,
        "tokenizer": str(out_dir / "tokenizer.json") if tokenizer == "bpe" else "byte",
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": np.dtype(dtype).name,
        "train_tokens": int(tokens.shape[0] - n_val),
        "val_tokens": int(n_val),
        "bytes_per_token": round(docs.n_bytes / max(1, tokens.shape[0]), 4),
        "files": [f.name for f in [*train_files, *val_files]],
    }
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def run(args: argparse.Namespace) -> int:
    if args.action != "prepare":  # argparse enforces the choice; kept for direct callers
        print(f"hyperwatch data: unknown action {args.action!r}; use 'prepare'", file=sys.stderr)
        return 2
    try:
        summary = prepare(
            source=args.source,
            out=args.out,
            path=args.path,
            text_field=args.text_field,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            val_fraction=args.val_fraction,
            chunk_tokens=args.chunk_tokens,
            max_bytes=args.max_bytes,
            force=args.force,
        )
    except DataError as exc:
        print(f"hyperwatch data prepare: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0
