"""Tokenizers and `prepare`: text and JSON lines into megatron-core .bin/.idx, read back with megatron."""
import json
import os

import numpy
import pytest

from hybridpar.data import ByteTokenizer, IndexedTokens, VocabMismatchError, check_vocab, load_tokenizer, prepare
from hybridpar.data._megatron import import_megatron
from hybridpar.data.embedded import corpus_files
from hybridpar.data.prepare import read_meta
from hybridpar.data.stats import unigram_entropy_bits
from hybridpar.errors import UsageError

DOCS = ["To be, or not to be: that is the question.", "Naïve café — ünïcödé survives.", "Exeunt."]


def read_documents(prefix):
    dataset = import_megatron("megatron.core.datasets.indexed_dataset").IndexedDataset(prefix)
    assert len(dataset.document_indices) == len(dataset) + 1  # one sequence per document
    return [numpy.asarray(dataset[i]).tolist() for i in range(len(dataset))]


def test_byte_tokenizer_round_trips_utf8_and_marks_end_of_document():
    tok = ByteTokenizer()
    for text in DOCS:
        ids = tok.encode(text)
        assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.decode(tok.encode("a") + [tok.eod] + tok.encode("b")) == "a\nb"
    assert (tok.vocab_size, tok.eod) == (257, 256)


def make_tokenizer_json(path, special="</s>"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", special])
    tok.train_from_iterator(DOCS * 20, trainer)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
    return tok.get_vocab_size()


def test_tokenizer_json_loads_from_file_or_directory_and_round_trips(tmp_path):
    vocab = make_tokenizer_json(tmp_path / "tokenizer.json")
    for spec in (str(tmp_path / "tokenizer.json"), str(tmp_path)):
        tok = load_tokenizer(spec)
        assert tok.vocab_size == vocab and tok.eod == tok._tok.token_to_id("</s>")
        for text in DOCS:
            assert tok.decode(tok.encode(text)) == text


def test_tokenizer_json_without_known_end_token_needs_eod_token(tmp_path):
    make_tokenizer_json(tmp_path / "tokenizer.json", special="<|doc|>")
    with pytest.raises(UsageError, match="--eod-token"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"), eod_token="<|doc|>")
    assert tok.eod == tok._tok.token_to_id("<|doc|>")
    (tmp_path / "doc.txt").write_text(DOCS[0])
    prepare([str(tmp_path / "doc.txt")], str(tmp_path / "ds"), tok, progress=False)
    source = IndexedTokens(str(tmp_path / "ds"), 4, 2)  # the tokenizer comes back from ds.meta.json
    assert (source.tokenizer.eod, source.vocab_size) == (tok.eod, tok.vocab_size)


def test_unknown_tokenizer_and_vocab_mismatch_are_usage_errors():
    with pytest.raises(UsageError, match="unknown tokenizer 'gpt9'"):
        load_tokenizer("gpt9")
    check_vocab(257, 320)  # the tiny model holds the byte tokenizer
    mismatch = "tokenizer/vocab mismatch: byte has 257 tokens but the model's vocab is 200"
    with pytest.raises(VocabMismatchError, match=mismatch):
        check_vocab(257, 200, "byte")


def test_prepare_text_files_round_trip_through_megatron(tmp_path):
    paths = []
    for i, text in enumerate(DOCS):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n  \n")
    tok = ByteTokenizer()
    inputs = [str(p) for p in paths] + [str(tmp_path / "blank.txt")]
    data = prepare(inputs, str(tmp_path / "out" / "ds"), tok, progress=False)
    assert (data.documents, data.tokens) == (3, sum(len(tok.encode(t)) + 1 for t in DOCS))
    docs = read_documents(str(tmp_path / "out" / "ds"))
    assert docs == [tok.encode(t) + [256] for t in DOCS]
    assert [tok.decode(d[:-1]) for d in docs] == DOCS
    assert read_meta(str(tmp_path / "out" / "ds")) == data
    assert sorted(os.listdir(tmp_path / "out")) == ["ds.bin", "ds.idx", "ds.meta.json"]


def test_prepare_json_lines_with_a_chosen_key_and_a_tokenizer_json(tmp_path):
    make_tokenizer_json(tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    lines = [json.dumps({"body": t, "id": i}) for i, t in enumerate(DOCS)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n", encoding="utf-8")
    prepare([str(tmp_path / "in.jsonl")], str(tmp_path / "ds"), tok, json_key="body", progress=False)
    docs = read_documents(str(tmp_path / "ds"))
    assert docs == [tok.encode(t) + [tok.eod] for t in DOCS]
    assert [tok.decode(d[:-1]) for d in docs] == DOCS


@pytest.mark.parametrize("documents, size", [(1, 1 << 30), (7, 1 << 30), (1 << 20, 300)])
def test_batched_tokenization_writes_what_one_document_at_a_time_writes(tmp_path, monkeypatch, documents, size):
    """prepare encodes documents in batches (by count or by bytes; encode_batch runs on every core): the
    files are byte for byte those of encoding one document at a time, blank lines and files between them."""
    import sys

    prepare_module = sys.modules["hybridpar.data.prepare"]  # the package binds the function under this name

    make_tokenizer_json(tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    play = open(corpus_files()[1], encoding="ascii").read()
    texts = [play[i: i + 40 + i % 97] for i in range(0, 20_000, 333)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" + ("\n" if k % 9 == 0 else "")
                                              for k, t in enumerate(texts[:40])), encoding="utf-8")
    (tmp_path / "b.txt").write_text(texts[40], encoding="utf-8")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[41:]), encoding="utf-8")
    inputs = [str(tmp_path / n) for n in ("a.jsonl", "b.txt", "c.jsonl")]
    prepare(inputs, str(tmp_path / "one"), tok, progress=False)
    assert read_documents(str(tmp_path / "one")) == [tok.encode(t) + [tok.eod] for t in texts]
    monkeypatch.setattr(prepare_module, "BATCH_DOCUMENTS", documents)
    monkeypatch.setattr(prepare_module, "BATCH_BYTES", size)
    prepare(inputs, str(tmp_path / "batched"), tok, progress=False)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"batched{ext}").read_bytes() == (tmp_path / f"one{ext}").read_bytes()


def test_failed_prepare_leaves_nothing_behind_and_keeps_the_old_files(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "fine"}) + "\n")
    prefix = str(tmp_path / "ds")
    prepare([str(good)], prefix, ByteTokenizer(), progress=False)
    before = {f: (tmp_path / f).read_bytes() for f in ("ds.bin", "ds.idx", "ds.meta.json")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"content": "no text key"}) + "\n")
    with pytest.raises(UsageError, match=r"bad.jsonl:2: no string under key 'text'"):
        prepare([str(good), str(bad)], prefix, ByteTokenizer(), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "ds.bin", "ds.idx", "ds.meta.json", "good.jsonl"]
    assert before == {f: (tmp_path / f).read_bytes() for f in before}


def test_embedded_corpus_is_plain_ascii_and_its_unigram_entropy(tmp_path):
    files = corpus_files()
    assert [os.path.basename(f) for f in files] == ["hamlet.txt", "macbeth.txt", "tempest.txt"]
    text = b"".join(open(f, "rb").read() for f in files)
    assert 300_000 < len(text) < 500_000 and max(text) < 128
    prepare(files, str(tmp_path / "emb"), ByteTokenizer(), progress=False)
    assert unigram_entropy_bits(str(tmp_path / "emb")) == pytest.approx(4.7757, abs=1e-4)
