"""`hybridpar data prepare` as users run it: the installed command in a subprocess."""
import json
import os
import subprocess
import sys

import numpy
import pytest

from hybridpar.data._megatron import import_megatron

HYBRIDPAR = os.path.join(os.path.dirname(sys.executable), "hybridpar")


def hybridpar(*args, cwd=None):
    return subprocess.run([HYBRIDPAR, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_prepare_jsonl_writes_megatron_files_and_reports_counts(tmp_path):
    lines = [json.dumps({"content": t}) for t in ("first document", "second one")]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "sub" / "ds"
    result = hybridpar("data", "prepare", str(tmp_path / "in.jsonl"), "--json-key", "content", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "2 documents, 26 tokens (tokenizer byte, vocab 257, end-of-document id 256)" in result.stdout
    dataset = import_megatron("megatron.core.datasets.indexed_dataset").IndexedDataset(str(out))
    assert bytes(numpy.asarray(dataset[1])[:-1].tolist()) == b"second one" and dataset[1][-1] == 256


def test_prepare_embedded_corpus(tmp_path):
    result = hybridpar("data", "prepare", "--embedded", "--out", str(tmp_path / "emb"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "3 documents, 375814 tokens" in result.stdout
    result = hybridpar("data", "info", str(tmp_path / "emb"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{tmp_path / 'emb'}: 375814 tokens, 3 documents, tokenizer byte (vocab 257)",
        "unigram entropy 4.7757 bits = 3.3103 nats per token",
    ]
    # the split the main job's data.held_out 0.34 gives: The Tempest (98,440 bytes and its end-of-document token)
    result = hybridpar("data", "info", str(tmp_path / "emb"), "--held-out", "0.34")
    assert result.stdout.splitlines()[-1] == ("data.held_out 0.34: trains on sequences 0-1 (277373 tokens), holds out "
                                              "the last 1 (98441 tokens)"), result.stdout
    result = hybridpar("data", "info", str(tmp_path / "emb"), "--held-out", "0.05")
    assert result.stdout.splitlines()[-1] == "data.held_out 0.05: of 3 sequences it holds out none (one sequence is 0.333 of them)"


def test_an_existing_dataset_is_replaced_only_with_overwrite(tmp_path):
    (tmp_path / "a.txt").write_text("first corpus")
    (tmp_path / "b.txt").write_text("second")
    out = str(tmp_path / "ds")
    assert hybridpar("data", "prepare", str(tmp_path / "a.txt"), "--out", out, "--quiet").returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.glob("ds.*")}
    again = hybridpar("data", "prepare", str(tmp_path / "b.txt"), "--out", out, "--quiet")
    assert again.returncode == 2 and "already exist" in again.stderr and "--overwrite" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in tmp_path.glob("ds.*")} == before
    replaced = hybridpar("data", "prepare", str(tmp_path / "b.txt"), "--out", out, "--quiet", "--overwrite")
    assert replaced.returncode == 0 and "1 documents, 7 tokens" in replaced.stdout, replaced.stderr
    assert sorted(p.name for p in tmp_path.glob("ds.*")) == ["ds.bin", "ds.idx", "ds.meta.json"]


def bad_cases(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "ok.txt").write_text("text")
    (tmp_path / "afile").write_text("")
    (tmp_path / "bad.jsonl").write_text("{not json}\n")
    return {
        "missing input": (["missing.txt"], "input missing.txt does not exist"),
        "no input": ([], "no input files"),
        "empty input": ([str(tmp_path / "empty.txt")], "every input is empty"),
        "unknown tokenizer": ([str(tmp_path / "ok.txt"), "--tokenizer", "gpt9"], "unknown tokenizer 'gpt9'"),
        "unwritable out dir": (
            [str(tmp_path / "ok.txt"), "--out", str(tmp_path / "afile" / "ds")],
            "cannot create output directory",
        ),
        "bad json": ([str(tmp_path / "bad.jsonl")], "bad.jsonl:1: not a JSON object"),
        "both inputs and embedded": ([str(tmp_path / "ok.txt"), "--embedded"], "not both"),
        "out names a directory": ([str(tmp_path / "ok.txt"), "--out", str(tmp_path / "out") + "/"], "names no file"),
        "out empty": ([str(tmp_path / "ok.txt"), "--out", ""], "names no file"),
        "eod token with byte": ([str(tmp_path / "ok.txt"), "--eod-token", "5"], "drop --eod-token"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing input",
        "no input",
        "empty input",
        "unknown tokenizer",
        "unwritable out dir",
        "bad json",
        "both inputs and embedded",
        "out names a directory",
        "out empty",
        "eod token with byte",
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, case):
    args, message = bad_cases(tmp_path)[case]
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "out" / "ds")]
    before = sorted(os.listdir(tmp_path))
    result = hybridpar("data", "prepare", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("hybridpar data: error: "), result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == before and not list(tmp_path.glob("out/*"))
