"""Decoding a request body as strict JSON: every way a body can be bad is a 400 that says what,
and where: the error names the field path (``tools[0].function.parameters.properties.n``).

Python's ``json`` accepts what JSON does not (``NaN``, ``Infinity``, duplicate keys, where the
last one silently wins) and fails on some valid JSON with errors that are not
``JSONDecodeError``: a 5,000-digit integer (``int``'s 4,300-digit limit, a ``ValueError``) and
deep nesting (``RecursionError``). Each became a 500. A lone UTF-16 surrogate (``"\\ud800"``) is
valid JSON that decodes to a string no encoder can write as UTF-8: the upstream body failed to
encode, another 500. Here each is an :class:`InvalidRequest`, raised before anything is
admitted, so a bad body costs the tenant nothing.

Finding *where* costs a second look at the body, so it is paid only by a body that is refused:
the decoder's hooks do not know the path, so :func:`_find` scans the text for the spot the
decoder refused. The one check every body pays is a search of its bytes for a surrogate escape.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

from hardcap_core import json_codec
from hardcap_core.errors import InvalidRequest

# Deepest nesting of arrays and objects accepted. A chat body needs about 10 (a JSON schema in
# response_format or a tool, nested a few levels); 64 leaves room for any real schema and keeps
# every later walk and re-serialization far from Python's recursion limit.
MAX_DEPTH = 64
# Longest integer literal accepted, in characters with the sign. No request field needs more
# than 20 (a 64-bit seed); parsing a long integer costs time quadratic in its length.
MAX_INTEGER_DIGITS = 100
# A field nested too deep is named by at most this many levels of its path (a path 64 levels
# deep says nothing more), cut back to the last key.
DEEP_PATH_LEVELS = 8
MAX_PATH_CHARS = 200  # a path of long keys is cut, so an error never echoes a whole body
BODY = "The request body"


class _Refused(Exception):
    """A decoding hook refused a value: ``what`` follows the subject (the field or the body);
    ``token`` is the literal as it is written, for finding it."""

    def __init__(self, what: str, token: str) -> None:
        super().__init__(what)
        self.what = what
        self.token = token


def _integer(literal: str) -> int:
    if len(literal) > MAX_INTEGER_DIGITS:
        raise _Refused(
            f"is an integer of {len(literal)} digits; at most {MAX_INTEGER_DIGITS} are accepted.",
            literal,
        )
    return int(literal)


def _number(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        # A literal like 1e999 overflows to infinity, which no field accepts.
        raise _Refused(f"is a number out of range: {literal[:40]}.", literal)
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"is not valid JSON: {name} is not a JSON value.", name)


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        duplicate = ""
        for duplicate, _ in pairs:
            if duplicate in seen:
                break
            seen.add(duplicate)
        raise _Duplicate(duplicate)
    return value


def loads(raw: bytes) -> Any:
    """The JSON value of ``raw``; raise :class:`InvalidRequest` saying what is wrong, and where."""
    try:
        value = json.loads(
            raw,
            parse_int=_integer,
            parse_float=_number,
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"The request body is not valid JSON: {e}") from None
    except RecursionError:
        _too_deep(raw)
    except _Refused as e:
        found = _find(raw, token=e.token)
        _refuse(found[0] if found else [], e.what)
    except _Duplicate as e:
        found = _find(raw, duplicate=True)
        _refuse(
            [*(found[0] if found else []), e.key],
            f"is given twice in one object (the key {json.dumps(e.key)[:80]} twice); which one "
            "a provider reads is not defined.",
        )
    if not _shallow(raw):
        _too_deep(raw)  # _shallow is exact: the body is too deep
    if _SURROGATE_ESCAPE.search(raw) or json.detect_encoding(raw) != "utf-8":
        _check_surrogates(value)
    return value


def _refuse(path: list[str | int], what: str) -> NoReturn:
    where = _render(path)
    subject = f"'{where}'" if where else BODY
    raise InvalidRequest(f"{subject} {what}", param=where or None) from None


# -- nesting ---------------------------------------------------------------------------------------

# Only brackets survive, and each becomes "[": nesting is all that is left to measure.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def _shallow(raw: bytes) -> bool:
    """Whether valid JSON ``raw`` nests at most :data:`MAX_DEPTH` deep, at C speed (a walk
    of the decoded value in Python took 8 ms for a 255 KB schema).

    Strings are cut out (escaped backslashes, then escaped quotes, then what lies between
    quotes), the brackets that remain are made one kind, and each pass of ``replace("[]")``
    removes exactly the innermost level: empty after ``MAX_DEPTH`` passes means no deeper.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return True
    outside = b"".join(raw.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    brackets = outside.translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        brackets = brackets.replace(b"[]", b"")
        if not brackets:
            return True
    return False


def _too_deep(raw: bytes) -> NoReturn:
    """Refuse ``raw`` for nesting past :data:`MAX_DEPTH`, naming the field that holds it."""
    found = _find(raw, deep=True)
    path = found[0][:DEEP_PATH_LEVELS] if found else []
    while path and isinstance(path[-1], int):
        path.pop()
    _refuse(path, f"is nested more than {MAX_DEPTH} levels deep (arrays and objects).")


# -- where: the path of the spot the decoder refused ---------------------------------------------

# A string, a structural character, or any other literal (numbers, true, NaN, -Infinity...).
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}:,]|[^\s\[\]{}:,"]++')


def _find(
    raw: bytes, *, token: str | None = None, duplicate: bool = False, deep: bool = False
) -> tuple[list[str | int], str] | None:
    """Where the decoder refused ``raw``, scanning it in the decoder's order: the first value
    written as ``token``; the first object to close with a key twice (the decoder checks each
    object as it closes, the innermost first); or (``deep``) the first array or object opened
    past :data:`MAX_DEPTH`. Returns the path of the value, object or container, and for a
    duplicate the key. None if it is not found (the body is not what the decoder read).

    Only a refused body pays for this: it is Python, a token at a time."""
    try:
        text = raw.decode(json.detect_encoding(raw))
    except (UnicodeDecodeError, LookupError):
        return None
    # Per open container: [its current key or index, expects a key next (objects), the keys
    # it has (objects; None for arrays), its first key seen twice].
    stack: list[list[Any]] = []
    for match in _TOKEN.finditer(text):
        tok = match.group()
        top = stack[-1] if stack else None
        first = tok[0]
        if first in "[{":
            if deep and len(stack) >= MAX_DEPTH:
                return [frame[0] for frame in stack], ""
            stack.append([0, False, None, None] if first == "[" else ["", True, set(), None])
        elif first in "]}":
            if top is None:
                return None
            stack.pop()
            if duplicate and top[3] is not None:
                return [frame[0] for frame in stack], top[3]
        elif first == ",":
            if top is not None and top[2] is None:
                top[0] += 1
            elif top is not None:
                top[1] = True
        elif first == ":":
            continue
        elif top is not None and top[1]:  # an object's key
            key = json.loads(tok) if "\\" in tok else tok[1:-1]
            if key in top[2] and top[3] is None:
                top[3] = key
            top[2].add(key)
            top[0], top[1] = key, False
        elif tok == token:
            return [frame[0] for frame in stack], ""
    return None


_NAME = re.compile(r"[A-Za-z_$][\w$-]*", re.ASCII)


def _render(path: list[str | int]) -> str:
    """``path`` as the error names a field: ``messages[0].content``; a key that is not a plain
    name is quoted and escaped (``metadata["a b"]``), so nothing in an error is unsendable."""
    out = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _NAME.fullmatch(part):
            out.append(f".{part}" if out else part)
        else:
            out.append(f"[{json.dumps(part)}]")
    text = "".join(out)
    return text if len(text) <= MAX_PATH_CHARS else text[: MAX_PATH_CHARS - 3] + "..."


# -- lone surrogates -------------------------------------------------------------------------------

# The escape of a surrogate, high (D800-DBFF) or low (DC00-DFFF), in any case. A pair decodes to
# one character, so most bodies that match are fine; only they pay for the exact check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_surrogates(value: Any) -> None:
    """Refuse a string (or key) that holds a lone surrogate, naming its field. The check is
    whether orjson can encode the body (C speed, and what the upstream body is encoded with);
    only when it cannot is the value walked for the field."""
    if json_codec.encodes(value):
        return
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:  # iterative, in the body's order: the first one is named
        node, path = stack.pop()
        if isinstance(node, str):
            found = _SURROGATE.search(node)
            if found:
                _refuse(
                    list(path),
                    f"has a lone surrogate (\\u{ord(found.group()):04x}), half of a UTF-16 "
                    "pair: it is not text, and cannot be sent on.",
                )
        elif isinstance(node, dict):
            for key, item in reversed(node.items()):
                stack.append((item, (*path, key)))
                stack.append((key, (*path, key)))
        elif isinstance(node, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(node))))
    # What orjson refused was an integer past 64 bits: json_codec.dumps encodes that.
