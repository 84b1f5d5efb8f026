"""DataConfig validation and load_corpus: every source, the train/val split and the token cache."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from hyperwatch.trainer.data import Corpus, DataConfig, load_corpus
from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.packed import write_packed
from hyperwatch.trainer.data.tokenizer import ByteTokenizer

EOS = ByteTokenizer.eos_id


def make_text_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("alpha beta gamma\n" * 30, encoding="utf-8")
    (root / "b.txt").write_text("délta epsilon\n" * 30, encoding="utf-8")
    return root


def text_cfg(tmp_path: Path, **kw: object) -> DataConfig:
    base: dict[str, object] = {
        "source": "text",
        "path": str(make_text_dir(tmp_path / "corpus")),
        "cache_dir": str(tmp_path / "cache"),
        "val_fraction": 0.1,
    }
    return DataConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "web"}, "DataConfig.source: 'web' is unknown"),
        ({"source": "text"}, "DataConfig.path: source 'text' needs a file or folder path"),
        ({"source": "text", "path": "/no/such/place"}, "DataConfig.path: '/no/such/place' does not exist"),
        ({"path": "/tmp"}, "DataConfig.path: source 'stdlib' reads the standard library"),
        ({"text_field": ""}, "DataConfig.text_field"),
        ({"tokenizer": "/no/tokenizer.json"}, "DataConfig.tokenizer: '/no/tokenizer.json' is not"),
        ({"tokenizer": "vocab:300"}, "cannot encode text"),
        ({"max_bytes": -5}, "DataConfig.max_bytes: -5"),
        ({"val_fraction": 0.0}, "DataConfig.val_fraction: 0.0"),
        ({"val_fraction": 1.5}, "DataConfig.val_fraction: 1.5"),
        ({"val_fraction": "0.1"}, "DataConfig.val_fraction: '0.1'"),
        ({"cache_dir": ""}, "DataConfig.cache_dir"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DataError) as err:
        DataConfig(**kwargs)  # type: ignore[arg-type]
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


def test_zero_max_bytes_means_no_cap() -> None:
    assert DataConfig(max_bytes=0).max_bytes is None
    assert DataConfig().max_bytes == 8_000_000


def test_text_corpus_split_and_content(tmp_path: Path) -> None:
    cfg = text_cfg(tmp_path)
    corpus = load_corpus(cfg)
    assert isinstance(corpus, Corpus) and corpus.vocab_size == 257
    a = "alpha beta gamma\n" * 30
    b = "délta epsilon\n" * 30
    expected = [*a.encode(), EOS, *b.encode(), EOS]
    assert np.concatenate([corpus.train, corpus.val]).tolist() == expected
    assert corpus.val.shape[0] == round(len(expected) * 0.1)
    assert "2 documents" in corpus.description and "val tokens" in corpus.description
    assert corpus.tokenizer is not None and corpus.tokenizer.decode(corpus.val).endswith("<|endoftext|>")


def test_second_load_reads_the_cache_file(tmp_path: Path) -> None:
    cfg = text_cfg(tmp_path)
    first = load_corpus(cfg)
    bins = list((tmp_path / "cache").glob("*.bin"))
    assert len(bins) == 1
    inode = bins[0].stat().st_ino
    second = load_corpus(cfg)
    assert isinstance(second.train, np.memmap) and Path(str(second.train.filename)) == bins[0].resolve()
    assert bins[0].stat().st_ino == inode  # not rewritten
    np.testing.assert_array_equal(first.train, second.train)
    assert first.description == second.description


def test_cache_follows_changes_of_the_source_and_tokenizer(tmp_path: Path) -> None:
    cfg = text_cfg(tmp_path)
    load_corpus(cfg)
    (tmp_path / "corpus" / "c.txt").write_text("zeta\n" * 50, encoding="utf-8")
    changed = load_corpus(cfg)
    assert len(list((tmp_path / "cache").glob("*.bin"))) == 2
    assert changed.tokenizer is not None and "zeta" in changed.tokenizer.decode(changed.val)
    load_corpus(text_cfg(tmp_path, max_bytes=100))
    assert len(list((tmp_path / "cache").glob("*.bin"))) == 3


def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    cfg = text_cfg(tmp_path)
    good = np.concatenate([load_corpus(cfg).train, load_corpus(cfg).val])
    (bin_path,) = (tmp_path / "cache").glob("*.bin")
    bin_path.write_bytes(bin_path.read_bytes()[:-10])
    again = load_corpus(cfg)
    np.testing.assert_array_equal(np.concatenate([again.train, again.val]), good)


def _load_in_child(cfg: DataConfig) -> int:
    corpus = load_corpus(cfg)
    return int(corpus.train.astype(np.int64).sum() + corpus.val.astype(np.int64).sum())


def test_concurrent_processes_share_one_cache_entry(tmp_path: Path) -> None:
    cfg = text_cfg(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        sums = pool.map(_load_in_child, [cfg, cfg])
    assert sums[0] == sums[1] == _load_in_child(cfg)
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len([f for f in files if f.endswith(".bin")]) == 1
    assert not [f for f in files if f.startswith(".")]  # no temp files left behind


def test_jsonl_corpus(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"body": f"record {i} " * 10}) for i in range(20)) + "\n", encoding="utf-8")
    corpus = load_corpus(DataConfig(source="jsonl", path=str(f), text_field="body", cache_dir=str(tmp_path / "c")))
    total = corpus.train.shape[0] + corpus.val.shape[0]
    assert total == sum(len(f"record {i} " * 10) + 1 for i in range(20))
    assert "20 documents" in corpus.description


def test_stdlib_corpus_default_source(tmp_path: Path) -> None:
    corpus = load_corpus(DataConfig(max_bytes=20_000, cache_dir=str(tmp_path)))
    assert corpus.vocab_size == 257
    n_docs = int(np.count_nonzero(np.concatenate([corpus.train, corpus.val]) == EOS))
    text_bytes = corpus.train.shape[0] + corpus.val.shape[0] - n_docs
    assert 20_000 - 3 <= text_bytes <= 20_000  # the cap, less a cut multi-byte character at most
    assert corpus.description.startswith("stdlib corpus at ") and "capped" in corpus.description


def test_packed_corpus_with_and_without_validation_files(tmp_path: Path) -> None:
    folder = tmp_path / "packed"
    write_packed(folder / "train_000.bin", np.arange(0, 200) % 250, np.uint16)
    write_packed(folder / "train_001.bin", np.arange(200, 300) % 250, np.uint16)
    corpus = load_corpus(DataConfig(source="packed", path=str(folder), val_fraction=0.25))
    assert corpus.train.shape[0] == 225 and corpus.val.shape[0] == 75  # tail split: no validation files
    np.testing.assert_array_equal(np.concatenate([corpus.train, corpus.val]), np.arange(300) % 250)

    write_packed(folder / "validation_000.bin", np.array([1, 2, 3, 4]), np.uint16)
    corpus = load_corpus(DataConfig(source="packed", path=str(folder)))
    assert corpus.train.shape[0] == 300 and corpus.val.tolist() == [1, 2, 3, 4]
    assert "2 train files, 1 validation files" in corpus.description


def test_packed_ids_beyond_the_tokenizer_vocabulary(tmp_path: Path) -> None:
    folder = tmp_path / "packed"
    write_packed(folder / "train_000.bin", np.arange(0, 1000), np.uint16)
    with pytest.raises(DataError, match=r"span 0\.\.999 but tokenizer 'byte' has vocab_size 257.*vocab:1000"):
        load_corpus(DataConfig(source="packed", path=str(folder)))
    corpus = load_corpus(DataConfig(source="packed", path=str(folder), tokenizer="vocab:32000"))
    assert corpus.vocab_size == 32000


def test_packed_truncated_file_fails_clearly(tmp_path: Path) -> None:
    folder = tmp_path / "packed"
    f = write_packed(folder / "train_000.bin", np.arange(100), np.uint16)
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(DataError, match=r"train_000\.bin: truncated.*224 bytes.*100 bytes"):
        load_corpus(DataConfig(source="packed", path=str(folder)))
