"""The trainer's data layer, one concept per module.

* :mod:`.corpus` -- ``DataConfig``, ``load_corpus`` and the on-disk token cache (the entry point);
* :mod:`.sources` -- reading documents from text, JSONL and the standard library;
* :mod:`.tokenizer` -- byte and BPE tokenizers;
* :mod:`.packed` -- LitGPT ``LITPKDS`` shards (read, write, memmap);
* :mod:`.loader` -- the rank-aware training batch loader and evaluation batches;
* :mod:`.cli` -- ``hyperwatch data prepare``;
* :mod:`.errors` -- ``DataError``, the one exception every reader raises on bad input.

The public names are re-exported here, loaded on first use, so ``from hyperwatch.trainer.data import
load_corpus`` works and importing the package (or :mod:`.config`) costs no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperwatch.trainer.data.corpus import (
        SOURCES,
        Corpus,
        DataConfig,
        DataError,
        Tokenizer,
        TokenLoader,
        iter_eval_batches,
        load_corpus,
        load_tokenizer,
    )

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


def __getattr__(name: str) -> Any:
    """The public names load on first use (``corpus`` imports torch; a command's --help must not)."""
    if name in __all__:
        return getattr(importlib.import_module("hyperwatch.trainer.data.corpus"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
