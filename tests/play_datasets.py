"""Small indexed datasets cut from the embedded plays, for the data tests: documents of known text,
prepared with the byte tokenizer. Shared by tests/unit/test_held_out_data.py, test_blend.py and
tests/integration/test_data_distributed.py."""
from __future__ import annotations

from pathlib import Path

from hybridpar.data import ByteTokenizer, prepare
from hybridpar.data.embedded import corpus_files


def play_dataset(root: Path, name: str, play: int, documents: int, start: int, stride: int,
                 length) -> tuple[str, list[str]]:
    """PREFIX root/name of ``documents`` documents cut from play ``play`` (0 Hamlet, 1 Macbeth, 2 The
    Tempest): document i is ``length(i)`` characters from ``start + stride * i``. Returns (prefix, texts)."""
    text = open(corpus_files()[play], encoding="ascii").read()
    texts = [text[start + stride * i: start + stride * i + length(i)] for i in range(documents)]
    paths = []
    for i, doc in enumerate(texts):
        paths.append(root / f"{name}-{i:03d}.txt")
        paths[-1].write_text(doc)
    prefix = str(root / name)
    prepare([str(p) for p in paths], prefix, ByteTokenizer(), progress=False)
    return prefix, texts
