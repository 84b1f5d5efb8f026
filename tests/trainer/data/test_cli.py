"""``hyperwatch data prepare`` end to end through the real dispatcher, on a tiny text folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hyperwatch.cli import main
from hyperwatch.trainer.data import DataConfig, TokenLoader, load_corpus
from hyperwatch.trainer.data.packed import read_header

DOCS = {
    "a.txt": "def square(x):\n    return x * x\n" * 40,
    "sub/b.txt": "The quick brown fox jumps over the lazy dog.\n" * 40,
    "c.md": "# Notes\n\nNaN and Inf are training facts.\n" * 40,
}


def make_folder(root: Path) -> Path:
    for name, text in DOCS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["data", "prepare", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_prepare_bpe_then_train_from_the_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = make_folder(tmp_path / "src"), tmp_path / "out"
    rc, stdout, _ = run_cli(
        capsys, "--source", "text", "--path", str(src), "--out", str(out),
        "--tokenizer", "bpe", "--vocab-size", "300", "--chunk-tokens", "1000", "--val-fraction", "0.1",
    )  # fmt: skip
    assert rc == 0
    summary = json.loads(stdout)
    assert summary["vocab_size"] == 300 and summary["dtype"] == "uint16" and summary["documents"] == 3
    assert (out / "tokenizer.json").is_file() and json.loads((out / "prepare.json").read_text()) == summary
    train_files = sorted(f.name for f in out.glob("train_*.bin"))
    assert train_files == [f for f in summary["files"] if f.startswith("train_")] and len(train_files) >= 2
    assert all(read_header(out / f).chunk_size <= 1000 for f in summary["files"])

    corpus = load_corpus(DataConfig(source="packed", path=str(out), tokenizer=str(out / "tokenizer.json")))
    assert corpus.vocab_size == 300
    assert (corpus.train.shape[0], corpus.val.shape[0]) == (summary["train_tokens"], summary["val_tokens"])
    assert corpus.tokenizer is not None
    text = corpus.tokenizer.decode(np.concatenate([corpus.train, corpus.val]))
    ordered = [DOCS["a.txt"], DOCS["c.md"], DOCS["sub/b.txt"]]  # sorted by relative path
    assert text == "".join(t + "<|endoftext|>" for t in ordered)
    x, _ = TokenLoader(corpus.train, 16, 2, seed=0).next_batch()
    assert x.shape == (2, 16) and int(x.max()) < 300


def test_prepare_byte_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = make_folder(tmp_path / "src"), tmp_path / "out"
    rc, stdout, _ = run_cli(capsys, "--source", "text", "--path", str(src), "--out", str(out))
    assert rc == 0
    summary = json.loads(stdout)
    assert summary["tokenizer"] == "byte" and summary["vocab_size"] == 257
    assert summary["files"] == ["train_000.bin", "validation_000.bin"]
    corpus = load_corpus(DataConfig(source="packed", path=str(out)))
    total = corpus.train.shape[0] + corpus.val.shape[0]
    assert total == sum(len(t.encode()) + 1 for t in DOCS.values())


def test_prepare_refuses_to_mix_with_old_shards_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = make_folder(tmp_path / "src"), tmp_path / "out"
    args = ["--source", "text", "--path", str(src), "--out", str(out), "--chunk-tokens", "500"]
    assert run_cli(capsys, *args)[0] == 0
    n_small = len(list(out.glob("train_*.bin")))
    rc, _, err = run_cli(capsys, *args)
    assert rc == 1 and "already holds" in err and "--force" in err
    rc, _, _ = run_cli(capsys, *args[:-2], "--chunk-tokens", "100000", "--force")
    assert rc == 0 and n_small > 1
    assert sorted(f.name for f in out.glob("*.bin")) == ["train_000.bin", "validation_000.bin"]


def test_prepare_errors_exit_nonzero_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "--source", "text", "--path", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert rc == 1 and out == "" and "no such file or folder" in err
    rc, _, err = run_cli(capsys, "--source", "jsonl", "--out", str(tmp_path / "o"))
    assert rc == 1 and "--path" in err
    src = make_folder(tmp_path / "src")
    rc, _, err = run_cli(
        capsys, "--source", "text", "--path", str(src), "--out", str(tmp_path / "o"), "--tokenizer", "bpe",
        "--vocab-size", "50",
    )  # fmt: skip
    assert rc == 1 and "--vocab-size 50" in err
    assert not (tmp_path / "o").exists()  # failed before writing anything


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [("--val-fraction", "1.5", "strictly between 0 and 1"), ("--chunk-tokens", "0", "positive integer")],
)
def test_prepare_flag_validation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, fragment: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["data", "prepare", "--out", str(tmp_path), flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and fragment in err


def test_prepare_stdlib_default_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, stdout, _ = run_cli(capsys, "--out", str(tmp_path / "o"), "--max-bytes", "5000")
    assert rc == 0
    summary = json.loads(stdout)
    assert summary["source"] == "stdlib" and summary["truncated"] is True and summary["text_bytes"] <= 5000
