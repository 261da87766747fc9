"""Local data files with defects: named by file, line and byte before `datasets` reads them."""

from __future__ import annotations

import json

import pytest

from grpocli.data import defects
from grpocli.data.files import load_local
from grpocli.errors import UserError


def test_offsets_lines_and_columns_hold_across_read_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(defects, "CHUNK_BYTES", 7)  # many chunks, boundaries inside characters
    good = "".join(json.dumps({"prompt": f"é{i} ü"}, ensure_ascii=False) + "\n" for i in range(9))
    file = tmp_path / "rows.jsonl"
    file.write_bytes(good.encode() + b'{"prompt": "ab\xffc"}\n')
    with pytest.raises(UserError) as err:
        defects.check_text(file, {})
    offset = len(good.encode()) + len('{"prompt": "ab')
    assert f"byte 0xff at offset {offset} (line 10, column 15)" in err.value.what
    assert err.value.where == f"{file}:10"
    file.write_bytes(good.encode())  # every multi-byte character split by some chunk boundary
    defects.check_text(file, {})


def test_a_truncated_character_at_the_end_is_named(tmp_path):
    file = tmp_path / "cut.csv"
    file.write_bytes(b"prompt\nab\xc3")
    with pytest.raises(UserError, match=r"byte 0xc3 at offset 9 \(line 2, column 3\)"):
        defects.check_text(file, {})


def test_the_named_encoding_is_used_and_an_unknown_one_is_refused(tmp_path):
    file = tmp_path / "rows.csv"
    file.write_bytes("prompt\ncafé\n".encode("latin-1"))
    defects.check_text(file, {"encoding": "latin-1"})
    defects.check_text(file, {"encoding_errors": "replace"})
    with pytest.raises(UserError) as err:
        defects.check_text(file, {"encoding": "latin-9000"})
    assert err.value.where == "data.args.encoding"


def test_load_args_are_checked_against_the_reader(tmp_path):
    file = tmp_path / "rows.csv"
    with pytest.raises(UserError) as err:
        defects.check_load_args("csv", {"delimeter": ";"}, file)
    assert err.value.where == "data.args.delimeter" and 'did you mean "delimiter"' in err.value.what
    assert "data.args={}" in err.value.hint
    defects.check_load_args("csv", {"delimiter": ";", "keep_in_memory": True}, file)
    defects.check_load_args("json", {"field": "rows"}, file)
    with pytest.raises(UserError, match="'num_samples'"):
        defects.check_load_args(None, {"num_samples": 5}, tmp_path)


def test_a_bad_line_in_a_directory_split_is_named(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "test.jsonl").write_text('{"prompt": "t"}\n')
    train = tmp_path / "d" / "train.jsonl"
    train.write_text('{"prompt": "a"}\n["not", "an", "object"]\n')
    for split in ("train", "test"):  # datasets builds both splits at once
        with pytest.raises(UserError) as err:
            load_local(split, 0, path=str(tmp_path / "d"))
        assert err.value.where == f"{train}:2" and "is a JSON list, not an object" in err.value.what
    train.write_text('{"prompt": "a"}\n')
    assert load_local("test", 0, path=str(tmp_path / "d"))["prompt"] == ["t"]


def test_a_json_document_that_does_not_parse_names_its_line(tmp_path):
    file = tmp_path / "rows.json"
    file.write_text('[\n{"prompt": "a"},\n{"prompt": "b",,}\n]\n')
    with pytest.raises(UserError) as err:
        load_local("train", 0, path=str(file))
    assert err.value.where == f"{file}:1"  # neither a document nor JSON lines: the first line
    assert "not valid JSON" in err.value.what
