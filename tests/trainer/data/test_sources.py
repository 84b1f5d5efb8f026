"""Text readers: file, folder, JSONL, the standard library; and each of their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperwatch.trainer.data import sources
from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.sources import read_documents


def test_text_file_is_one_document(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("héllo wörld\n", encoding="utf-8")
    docs = read_documents("text", f)
    assert docs.texts == ["héllo wörld\n"]
    assert docs.n_bytes == len("héllo wörld\n".encode())
    assert not docs.truncated


def test_text_folder_sorted_recursive_skipping_hidden_and_empty(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second", encoding="utf-8")
    (tmp_path / "a.md").write_text("first", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("third", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / ".hidden").write_text("no", encoding="utf-8")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x").write_text("no", encoding="utf-8")
    docs = read_documents("text", tmp_path)
    assert docs.texts == ["first", "second", "third"]
    assert [f.name for f in docs.files] == ["a.md", "b.txt", "c.txt"]


def test_non_utf8_text_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.txt: not UTF-8 text \(invalid byte at offset 3\)"):
        read_documents("text", tmp_path)


def test_missing_path_and_missing_path_argument(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file or folder"):
        read_documents("text", tmp_path / "nope")
    with pytest.raises(DataError, match="needs a path"):
        read_documents("jsonl", None)


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="the corpus is empty"):
        read_documents("text", tmp_path)
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    with pytest.raises(DataError, match="holds no files"):
        read_documents("text", empty_dir)


def test_max_bytes_caps_on_a_character_boundary(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("aaaa", encoding="utf-8")
    (tmp_path / "b.txt").write_text("ééé", encoding="utf-8")  # 6 bytes
    (tmp_path / "c.txt").write_text("never read", encoding="utf-8")
    docs = read_documents("text", tmp_path, max_bytes=7)
    assert docs.texts == ["aaaa", "é"]  # 4 + 2 bytes; the next é would cross 7
    assert docs.n_bytes == 6 and docs.truncated
    exact = read_documents("text", tmp_path / "a.txt", max_bytes=4)
    assert exact.texts == ["aaaa"] and not exact.truncated
    with pytest.raises(DataError, match="max_bytes 0"):
        read_documents("text", tmp_path, max_bytes=0)


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_file_and_folder(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [json.dumps({"content": "three"})])
    write_jsonl(tmp_path / "a.jsonl", [json.dumps({"content": "one", "id": 1}), "", json.dumps({"content": "two"})])
    (tmp_path / "notes.txt").write_text("ignored: not .jsonl", encoding="utf-8")
    docs = read_documents("jsonl", tmp_path, text_field="content")
    assert docs.texts == ["one", "two", "three"]
    assert read_documents("jsonl", tmp_path / "b.jsonl", text_field="content").texts == ["three"]


def test_jsonl_bad_json_names_file_and_line(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "ok"}), "{not json"])
    with pytest.raises(DataError, match=r"d\.jsonl:2: not valid JSON"):
        read_documents("jsonl", f)


def test_jsonl_missing_field_names_file_line_and_keys(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "ok"}), json.dumps({"body": "x"})])
    with pytest.raises(DataError, match=r"d\.jsonl:2: no field 'text' \(found \['body'\]\).*--text-field"):
        read_documents("jsonl", f)
    g = write_jsonl(tmp_path / "e.jsonl", ["[1, 2]"])
    with pytest.raises(DataError, match=r"e\.jsonl:1: no field 'text' \(found list\)"):
        read_documents("jsonl", g)


def test_jsonl_non_string_field(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": 3})])
    with pytest.raises(DataError, match=r"d\.jsonl:1: field 'text' is int, not a string"):
        read_documents("jsonl", f)


def test_jsonl_non_utf8_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8"):
        read_documents("jsonl", f)


def test_real_stdlib_is_python_source() -> None:
    docs = read_documents("stdlib", max_bytes=30_000)
    assert docs.root == sources.stdlib_root()
    assert docs.n_bytes <= 30_000 and docs.truncated
    assert all(f.suffix == ".py" and "site-packages" not in f.parts for f in docs.files)
    rel = [f.relative_to(docs.root).as_posix() for f in docs.files]
    assert rel == sorted(rel)
    assert any("def " in t or "import " in t for t in docs.texts)


def test_stdlib_skips_non_utf8_and_site_packages_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "bad.py").write_bytes(b"# -*- coding: latin-1 -*-\ns = '\xe9'\n")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "pkg.py").write_text("installed = True\n", encoding="utf-8")
    (tmp_path / "data.txt").write_text("not python", encoding="utf-8")
    monkeypatch.setattr(sources, "stdlib_root", lambda: tmp_path)
    docs = read_documents("stdlib")
    assert docs.texts == ["x = 1\n"]
    assert [(f.name, reason) for f, reason in docs.skipped] == [("bad.py", "not UTF-8 (byte 31)")]
    assert "1 skipped" in docs.describe("stdlib")
