"""Raw-text corpora, all on the local disk: the Python standard library, text files, JSONL.

Each reader returns :class:`Documents`: the texts in a deterministic order (files sorted by their
path relative to the root; JSONL records in file order), capped at ``max_bytes`` of UTF-8 so a
demo reads the same 8 MB on every machine. Every file or record is one document; the tokenizer
layer joins documents with its end-of-document id.

The default corpus is the standard library's own ``.py`` source tree: it exists wherever Python
does, so the demo needs no download. Its files that are not UTF-8 (a few test fixtures) or that
cannot be read are skipped with a logged reason; a user's own text that is not UTF-8 is an error.
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hyperwatch.trainer.data.errors import DataError

log = logging.getLogger(__name__)

TEXT_SOURCES = ("stdlib", "text", "jsonl")
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass
class Documents:
    texts: list[str]
    files: list[Path]  # files that contributed text, in reading order
    n_bytes: int  # UTF-8 bytes kept (after the cap)
    truncated: bool  # True when max_bytes stopped the reading early
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (file, reason), stdlib only
    root: Path | None = None

    def describe(self, source: str) -> str:
        cap = ", capped" if self.truncated else ""
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        return (
            f"{source} corpus at {self.root}: {len(self.texts)} documents from {len(self.files)} files"
            f"{skipped}, "
            f"{self.n_bytes / 1e6:.2f} MB of text{cap}"
        )


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder (outside any virtualenv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk_sorted(root: Path, keep: str | None) -> list[Path]:
    """Regular files under ``root`` (suffix ``keep`` if given), skipping hidden entries and
    ``_SKIP_DIRS``, sorted by their path relative to ``root``."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or (keep is not None and not name.endswith(keep)):
                continue
            found.append(Path(dirpath) / name)
    return sorted(found, key=lambda f: f.relative_to(root).as_posix())


def list_source_files(source: str, path: str | Path | None) -> tuple[Path, list[Path]]:
    """``(root, files)`` a text source would read, in reading order; :class:`DataError` if none."""
    if source == "stdlib":
        root = stdlib_root()
        if not root.is_dir():
            raise DataError(f"source 'stdlib': the standard library folder {root} does not exist")
        return root, _walk_sorted(root, ".py")
    if source not in ("text", "jsonl"):
        raise DataError(f"source {source!r}: not a text source; valid: {', '.join(TEXT_SOURCES)}")
    if path is None:
        raise DataError(f"source {source!r} needs a path: set DataConfig.path (or --path) to a file or folder")
    root = Path(path)
    if root.is_file():
        return root, [root]
    if not root.is_dir():
        raise DataError(f"data path {str(path)!r}: no such file or folder; check the path")
    files = _walk_sorted(root, ".jsonl" if source == "jsonl" else None)
    if not files:
        kind = "*.jsonl files" if source == "jsonl" else "files"
        raise DataError(f"data path {root}: the folder holds no {kind}; the corpus would be empty")
    return root, files


class _Budget:
    """Keeps the total of UTF-8 bytes under ``max_bytes`` (None: no cap), cutting the last text."""

    def __init__(self, max_bytes: int | None) -> None:
        self.left = max_bytes
        self.used = 0
        self.truncated = False

    def take(self, text: str) -> str:
        size = len(text.encode("utf-8"))
        if self.left is not None and size > self.left:
            # Cut on a byte budget, dropping a partial trailing character.
            text = text.encode("utf-8")[: self.left].decode("utf-8", errors="ignore")
            size = len(text.encode("utf-8"))
            self.truncated = True
        self.used += size
        if self.left is not None:
            self.left = 0 if self.truncated else self.left - size  # after a cut, stop reading
        return text

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0


def _read_utf8(f: Path) -> str:
    try:
        raw = f.read_bytes()
    except OSError as exc:
        raise DataError(f"{f}: cannot read ({exc.strerror}); check the file's permissions") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{f}: not UTF-8 text (invalid byte at offset {exc.start}); convert it to UTF-8 "
            "(e.g. iconv -t UTF-8) or remove it from the corpus"
        ) from exc


def _iter_stdlib(files: list[Path], skipped: list[tuple[Path, str]]) -> Iterator[tuple[Path, str]]:
    for f in files:
        try:
            text = f.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 (byte {exc.start})"
            skipped.append((f, reason))
            log.info("stdlib corpus: skipping %s: %s", f, reason)
            continue
        except OSError as exc:
            reason = f"unreadable ({exc.strerror})"
            skipped.append((f, reason))
            log.warning("stdlib corpus: skipping %s: %s", f, reason)
            continue
        yield f, text


def _iter_text(files: list[Path]) -> Iterator[tuple[Path, str]]:
    for f in files:
        yield f, _read_utf8(f)


def _iter_jsonl(files: list[Path], text_field: str) -> Iterator[tuple[Path, str]]:
    for f in files:
        try:
            fh = f.open("rb")
        except OSError as exc:
            raise DataError(f"{f}: cannot read ({exc.strerror}); check the file's permissions") from exc
        with fh:
            for lineno, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{f}:{lineno}: not UTF-8 text; convert the file to UTF-8") from exc
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{f}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}); each line of a "
                        "JSONL file must be one JSON object"
                    ) from exc
                if not isinstance(record, dict) or text_field not in record:
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise DataError(
                        f"{f}:{lineno}: no field {text_field!r} (found {keys}); set text_field "
                        "(--text-field) to the field that holds the text"
                    )
                text = record[text_field]
                if not isinstance(text, str):
                    raise DataError(f"{f}:{lineno}: field {text_field!r} is {type(text).__name__}, not a string")
                yield f, text


def read_documents(
    source: str, path: str | Path | None = None, text_field: str = "text", max_bytes: int | None = None
) -> Documents:
    """Read a text source (``stdlib``, ``text`` or ``jsonl``) into documents, up to ``max_bytes``."""
    if max_bytes is not None and max_bytes <= 0:
        raise DataError(f"max_bytes {max_bytes}: must be positive, or None to read everything")
    root, files = list_source_files(source, path)
    skipped: list[tuple[Path, str]] = []
    if source == "stdlib":
        stream = _iter_stdlib(files, skipped)
    elif source == "text":
        stream = _iter_text(files)
    else:
        stream = _iter_jsonl(files, text_field)
    budget = _Budget(max_bytes)
    texts: list[str] = []
    used: list[Path] = []
    for f, text in stream:
        if not text:
            continue
        if budget.exhausted:  # more text remains than the cap allows
            budget.truncated = True
            break
        piece = budget.take(text)
        if not piece:  # the cap fell inside this text's first character
            break
        texts.append(piece)
        if not used or used[-1] != f:
            used.append(f)
    if not texts or budget.used == 0:
        where = root if source != "stdlib" else f"the standard library at {root}"
        raise DataError(f"{where}: the corpus is empty (no non-empty text found); point the path at text data")
    return Documents(
        texts=texts, files=used, n_bytes=budget.used, truncated=budget.truncated, skipped=skipped, root=root
    )
