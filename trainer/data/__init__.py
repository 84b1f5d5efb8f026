"""The trainer's data layer, one concept per module.

* :mod:`.corpus` -- ``DataConfig``, ``load_corpus`` and the on-disk token cache (the entry point);
* :mod:`.sources` -- reading documents from text, JSONL and the standard library;
* :mod:`.tokenizer` -- byte and BPE tokenizers;
* :mod:`.packed` -- LitGPT ``LITPKDS`` shards (read, write, memmap);
* :mod:`.loader` -- the rank-aware training batch loader and evaluation batches;
* :mod:`.cli` -- ``hyperwatch data prepare``;
* :mod:`.errors` -- ``DataError``, the one exception every reader raises on bad input.

The public names are re-exported here so ``from hyperwatch.trainer.data import load_corpus`` works.
"""

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
