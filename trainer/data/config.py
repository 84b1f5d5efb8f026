"""``DataConfig``: where the tokens come from. Standard library only, so the trainer's config and
its commands' ``--help`` load without torch or numpy (:mod:`.corpus` re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hyperwatch.trainer.data.errors import DataError

SOURCES = ("stdlib", "text", "jsonl", "packed")


@dataclass
class DataConfig:
    """Where the tokens come from. Validated on construction; errors name the field and the fix."""

    source: str = "stdlib"  # "stdlib" | "text" | "jsonl" | "packed"
    path: str | None = None  # file or folder for text/jsonl/packed; unused (None) for stdlib
    text_field: str = "text"  # the JSONL field that holds a document's text
    tokenizer: str = "byte"  # "byte" | "vocab:N" (packed only) | path to a tokenizer.json
    max_bytes: int | None = 8_000_000  # cap on raw text read (the stdlib tree is ~30+ MB); None or 0 = all
    val_fraction: float = 0.05  # held-out tail when the source has no validation split
    cache_dir: str = "data_cache"  # tokenized text corpora are cached here

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise DataError(f"DataConfig.source: {self.source!r} is unknown; choose one of {', '.join(SOURCES)}")
        if self.source == "stdlib":
            if self.path is not None:
                raise DataError(
                    "DataConfig.path: source 'stdlib' reads the standard library and takes no path; "
                    "remove path or choose source 'text', 'jsonl' or 'packed'"
                )
        else:
            if not isinstance(self.path, str) or not self.path:
                raise DataError(f"DataConfig.path: source {self.source!r} needs a file or folder path")
            if not Path(self.path).exists():
                raise DataError(f"DataConfig.path: {self.path!r} does not exist; check the path")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise DataError("DataConfig.text_field: must be a non-empty string (the JSONL text field)")
        self._check_tokenizer()
        if self.max_bytes == 0:
            self.max_bytes = None  # TOML has no null: 0 means "no cap"
        if self.max_bytes is not None and (
            not isinstance(self.max_bytes, int) or isinstance(self.max_bytes, bool) or self.max_bytes < 0
        ):
            raise DataError(f"DataConfig.max_bytes: {self.max_bytes!r}; use a positive integer, or 0/None for all")
        frac = self.val_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac < 1.0:
            raise DataError(f"DataConfig.val_fraction: {frac!r}; must be a number strictly between 0 and 1")
        if not isinstance(self.cache_dir, str) or not self.cache_dir:
            raise DataError("DataConfig.cache_dir: must be a non-empty folder path")

    def _check_tokenizer(self) -> None:
        spec = self.tokenizer
        if not isinstance(spec, str) or not spec:
            raise DataError("DataConfig.tokenizer: use 'byte', 'vocab:N' or a path to a tokenizer.json")
        if spec == "byte":
            return
        if spec.startswith("vocab:"):
            if self.source != "packed":
                raise DataError(
                    f"DataConfig.tokenizer: {spec!r} cannot encode text; it is only for source 'packed' "
                    "(pre-tokenized shards); use 'byte' or a tokenizer.json for text sources"
                )
            return
        if not Path(spec).exists():
            raise DataError(
                f"DataConfig.tokenizer: {spec!r} is not 'byte', 'vocab:N' or an existing tokenizer.json; "
                "train one with 'hyperwatch data prepare --tokenizer bpe --out DIR'"
            )
