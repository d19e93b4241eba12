"""Reading a model or GPU description from a .json, .yaml or .yml file: one mapping, or one
line that says what is wrong with the file."""
from __future__ import annotations

import json
from pathlib import Path

SUFFIXES = (".json", ".yaml", ".yml")


def names_a_file(text: str) -> bool:
    """A --model/--gpu value is a file when it has a spec file's suffix or is an existing file;
    anything else is a preset or catalogue name."""
    path = Path(text)
    return path.suffix in SUFFIXES or path.is_file()


def read_mapping(path_text: str, what: str, error: type[Exception]) -> dict:
    """The mapping in the file at path_text; ``what`` ("model", "GPU") names it in errors, which
    are raised as ``error`` with one line."""
    path = Path(path_text)
    if not path.is_file():
        raise error(f"{what} file {path_text} not found")
    if path.suffix not in SUFFIXES:
        raise error(f"{what} file {path_text}: use .json, .yaml or .yml")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{what} file {path_text} is unreadable: {err}") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys) if path.suffix == ".json" else _load_yaml(text)
    except DuplicateKey as err:
        raise error(f"{what} file {path_text} has the key '{err.key}' twice{err.where}: the later one would "
                    "silently win; keep one") from None
    except Exception as err:  # json.JSONDecodeError or yaml.YAMLError
        raise error(f"{what} file {_where(path_text, err)} is malformed: {_problem(err)}") from None
    if not isinstance(data, dict):
        raise error(f"{path_text}: expected a mapping of {what} keys, got {type(data).__name__}")
    return data


class DuplicateKey(ValueError):
    def __init__(self, key, where: str = ""):
        super().__init__(key)
        self.key, self.where = key, where


def _unique_keys(pairs: list) -> dict:
    """json's object_pairs_hook: a mapping that names a key twice is refused (json.loads keeps the last)."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def _load_yaml(text: str):
    """yaml.safe_load, refusing a mapping that names a key twice (PyYAML keeps the last)."""
    import yaml  # only needed for YAML files

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise DuplicateKey(key, f" (line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _where(path_text: str, err: Exception) -> str:
    """``file:line:column`` of a parse error (1-based, as editors count), or the file alone."""
    line = getattr(err, "lineno", None)  # json
    column = getattr(err, "colno", None)
    mark = getattr(err, "problem_mark", None)  # yaml
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    return f"{path_text}:{line}:{column}" if line else path_text


def _problem(err: Exception) -> str:
    problem = getattr(err, "problem", None) or getattr(err, "msg", None)  # yaml, json: the message alone
    if problem:
        context = getattr(err, "context", None)
        return f"{problem} ({context})" if context else problem
    return (str(err).splitlines() or ["parse error"])[0]
