"""What a PDF in a prompt costs: its pages, read by a real parser (pypdf), and a bound on the
text of each from what the page draws, not from the bytes of the file.

Providers bill each page's text and an image of each page (OpenAI's file inputs guide: "the
extracted text and an image of each page", on vision models; Anthropic's PDF support: text
"1,500 to 3,000 tokens" a page, plus the image), the image at most the most one image of any
size costs with the model. The parse counts it as GPT-4o's (:data:`PARSE_PAGE_IMAGE_TOKENS`),
the route not being known yet; each route target replaces that by its model's
(:func:`hardcap_core.tokenize.images.image_extra_tokens`), as it does for images. A page's text
is bounded by what it draws: the strings of the text operators (``Tj``, ``TJ``, ``'``, ``"``)
of its content streams, decoded (a stream shared by pages counting for each; each form XObject
times the times the content names it, nested forms multiplying; tiling patterns; its
annotations' normal appearance and text). A string shown in a simple font whose mapping is
known (a standard encoding, no ``/ToUnicode``, no ``/Differences``, no embedded program) is
decoded through that encoding (pypdf's own tables) and bounded as any prompt text is
(:func:`~hardcap_core.tokenize.heuristics.input_text_tokens`); in any other font its bytes
count times the most a byte becomes as text with that font (its ``/ToUnicode`` CMap's longest
destination, its glyph names), in UTF-8 bytes, each at most a token; with no font set, the most
of any font of the page. Each text operator adds a token for the line break or space an
extractor may put there. Operators, numbers and images draw no text, so they count nothing.
Extracted text is not trusted: an extractor can miss what another sees. Past
:data:`MAX_PARSED_BYTES` of content a request, the rest is not parsed but counted as before:
every decoded byte, times the most a byte becomes with the page's fonts.

The work is capped per request (:class:`Allowance`: pages, decoded bytes, objects, steps), and
pypdf's own limits are set from the caps. Past a cap a request is refused (400), never skipped,
as it is for a declared PDF pypdf cannot read, or one encrypted with a password other than the
empty one (pypdf decrypts RC4 itself; AES needs ``cryptography``, which the Lambda artifact
does not ship: there, an AES-encrypted PDF is refused). pypdf is imported with the first PDF
(about 0.2 s): a cold start pays for it only when a request carries one.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from hardcap_core.errors import InvalidRequest
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.wire.media import IMAGE_BOUND_TOKENS

# Caps per request. Pages: above any provider's own limit (Anthropic: 100 a request, 600 with
# a 1M-token context window). Decoded bytes: content streams, forms, CMaps, object streams.
MAX_PAGES = 1_000
MAX_DECODED_BYTES = 16 * 1024 * 1024
# Objects held (cross-reference entries, and what each object stream says it packs): pypdf
# parses one in about 0.1 ms, a whole object stream at once: at most about 2 s of CPU.
MAX_OBJECTS = 20_000
# Steps of the walk (a few microseconds each once pypdf parsed the object): a page tree that
# lists one page 1,000 times with the same 20,000 annotations stops here.
MAX_STEPS = 200_000
# The file's structure (a cross-reference stream, the object streams), parsed at about 1 MB/s.
MAX_STRUCTURE_BYTES = 2 * 1024 * 1024
MAX_FORM_DEPTH = 16  # a form draws a form that draws a form...: deeper is refused
# Content parsed for its text operators by pypdf's content parser: about 1.5 MB/s on prose,
# 0.25 MB/s on content crafted as tiny strings (about 2 s for this much). Past it, a request's
# content streams count every byte, as a string of the widest font the stream may use.
MAX_PARSED_BYTES = 512 * 1024

# An image of each page, billed as one image of a size not known here (the size a page is
# rendered at is not documented): at most the most one image costs with the route's model (its
# rule's largest, tokenize/images.py: GPT-4o's 85 + 170 x 8 tiles = 1,445; Claude up to 4.6
# 1,640; Claude Opus 4.7 4,784; gpt-4.1-nano 1,536 patches x 2.46 = 3,779; a model of no known
# family the dearest of all). The parse, before the route is known, counts GPT-4o's; each route
# target replaces it by its model's, as it does for the parse's GPT-4o count of images.
PARSE_PAGE_IMAGE_TOKENS = IMAGE_BOUND_TOKENS

# The most a drawn byte becomes as text (UTF-8 bytes) unless its font's CMap or glyph names say
# more: a simple font maps a byte to a character (at most 3 bytes: standard encodings stay in
# the BMP); an Identity-encoded composite font, 2 bytes to one (a CID: at most 3). Without a
# font there is no text to extract; the bytes still count, one token each.
SIMPLE_FONT_EXPANSION = 3.0
IDENTITY_FONT_EXPANSION = 1.5
BYTE_EXPANSION = 1.0


@dataclass(frozen=True, slots=True)
class PdfCost:
    """What a document costs, before the page images (which depend on the route's model), and
    what reading it took (charged to the request's :class:`Allowance`)."""

    pages: int
    text_tokens: int  # an upper bound on the text of every page, and the document's info
    decoded_bytes: int
    objects: int
    steps: int

    def tokens(self, page_image: int = PARSE_PAGE_IMAGE_TOKENS) -> int:
        """The document's bound with an image of each page costing at most ``page_image``
        (the parse's: GPT-4o's largest image)."""
        return self.text_tokens + self.pages * page_image


class Allowance:
    """What one request's documents may make the gateway read, together."""

    def __init__(self) -> None:
        self.left = {"pages": MAX_PAGES, "decoded_bytes": MAX_DECODED_BYTES}
        self.left |= {"objects": MAX_OBJECTS, "steps": MAX_STEPS}

    def charge(self, cost: PdfCost, where: str) -> None:
        """Take a read document's share; refuse the request past any cap. A document read
        earlier (cached) is charged the same, so a request's answer never depends on it."""
        for cap in self.left:
            self.left[cap] -= getattr(cost, cap)
            if self.left[cap] < 0:
                raise _refused(where, _WHY[cap])


def is_declared_pdf(url: str, filename: Any, data: bytes) -> bool:
    """Whether a file says it is a PDF: its media type, its name, or the header a reader
    looks for in its first 1,024 bytes."""
    media = url[5 : url.find(";")].strip().lower() if url.startswith("data:") else ""
    named = isinstance(filename, str) and filename.strip().lower().endswith(".pdf")
    return media == "application/pdf" or named or b"%PDF-" in data[:1024]


def pdf_cost(data: bytes, where: str, allowance: Allowance, *, declared: bool) -> PdfCost | None:
    """The cost of ``data`` read as a PDF, charged to ``allowance``; None for a file that is
    not one and does not say it is. Raise :class:`InvalidRequest` naming ``where`` for a
    declared PDF that cannot be read, and for any document past a cap."""
    key = hashlib.blake2b(data, digest_size=16).digest()
    with _lock:
        cost = _cache.get(key)
    if cost is None:
        try:
            cost = _read(data, allowance)
        except _TooLarge as e:
            raise _refused(where, str(e)) from None
        except _Unreadable as e:
            if not declared and not e.opened:
                return None
            raise InvalidRequest(
                f"'{where}': the document cannot be read as a PDF ({e}), so its pages cannot "
                "be counted before the call.",
                param=where,
            ) from None
        with _lock:  # the last documents read: a request's estimate and admission share them
            _cache[key] = cost
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    allowance.charge(cost, where)
    return cost


_WHY = {
    "pages": f"have more than {MAX_PAGES} pages, more than any provider takes",
    "decoded_bytes": f"decode to more than {MAX_DECODED_BYTES} bytes",
    "objects": f"hold more than {MAX_OBJECTS} objects",
    "steps": f"take more than {MAX_STEPS} steps to walk",
}
_CACHE_SIZE = 64
_cache: OrderedDict[bytes, PdfCost] = OrderedDict()
_lock = threading.Lock()  # the local servers run the gateway and the mock in threads


class _Unreadable(Exception):
    """A file pypdf cannot read as a PDF (``opened``: it found pages, so it is a broken PDF)."""

    def __init__(self, why: str, *, opened: bool = False) -> None:
        super().__init__(why)
        self.opened = opened


class _TooLarge(Exception):
    """A document past one of the request's caps: never skipped, always refused."""


def _refused(where: str, why: str) -> InvalidRequest:
    message = f"this request's documents {why}; the gateway does not read further to count them"
    return InvalidRequest(f"'{where}': {message}, so it cannot admit them.", param=where)


def _read(data: bytes, allowance: Allowance) -> PdfCost:
    """Open ``data`` with pypdf under the caps' limits and bound what it costs."""
    import pypdf  # here: a cold start pays for it only when a request carries a PDF

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a hostile file's warnings are noise
    walk = _Walk(allowance)  # once it finds pages (opened), a failure is a broken PDF
    try:
        # The file's structure (cross-reference streams, object streams) is parsed object by
        # object in Python: its streams get a smaller limit than the content, only counted.
        with pypdf.apply_configuration(None, **_limits(MAX_STRUCTURE_BYTES)):
            reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
            if reader.is_encrypted and not reader.decrypt(""):
                raise _Unreadable("it is encrypted with a password")
            walk.structure(reader)
        with pypdf.apply_configuration(None, **_limits(allowance.left["decoded_bytes"])):
            return walk.document(reader)
    except _TooLarge:
        raise
    except _Unreadable as e:
        raise _Unreadable(str(e), opened=walk.opened) from None
    except pypdf.errors.LimitReachedError as e:
        raise _TooLarge(f"pass a limit of the PDF reader ({str(e)[:200]})") from None
    except pypdf.errors.DependencyError:  # AES without the cryptography package
        raise _Unreadable("it is encrypted with AES; send it unencrypted") from None
    except RecursionError:
        raise _Unreadable("it nests objects too deeply", opened=walk.opened) from None
    except Exception as e:
        # pypdf raises many kinds of error on a malformed file. The parser failing on client
        # bytes is the client's 400 (named by the caller); a bug of ours would show as every
        # PDF refused, which the tests would see.
        raise _Unreadable(str(e)[:200] or type(e).__name__, opened=walk.opened) from None


def _limits(decoded: int) -> dict[str, int]:
    """pypdf's limits for a walk that may decode ``decoded`` more bytes (and one)."""
    kinds = ("zlib", "lzw", "run_length", "array_based_stream")
    limits = {f"{kind}_maximum_output_length": max(decoded, 0) + 1 for kind in kinds}
    return limits | {"page_tree_maximum_entries": 4 * MAX_PAGES} | _PAGE_ENTRIES


_PAGE_ENTRIES = {"page_tree_maximum_page_entries": 64 * MAX_PAGES}
_NONE: dict[str, Any] = {}  # what a missing dictionary reads as; never written to
_Res = dict[str, Any]  # a resource dictionary
_Path = frozenset[int]  # the forms being drawn, by identity
_Shown = Any  # how a font's strings count: a table of 256 characters, or bytes' expansion


class _Walk:
    """One document's pages, forms and fonts, each read once (memos by object identity:
    pypdf hands out one object per indirect reference, and a page's inline ones are shared)."""

    def __init__(self, allowance: Allowance) -> None:
        self.left = allowance.left
        self.objects = self.decoded = self.steps = 0
        self.opened = False
        self.lengths: dict[int, int] = {}  # stream -> decoded length
        self.forms: dict[tuple[int, int, bool], int] = {}  # (form, resources, parsed) -> tokens
        self.joins: dict[tuple[int, ...], Any] = {}  # a page's content streams, joined
        self.parsed = 0  # content bytes parsed for text operators
        self.form_lists: dict[int, list[tuple[bytes, Any]]] = {}  # /XObject dict -> its forms
        self.expansions: dict[int, float] = {}  # /Font dict or font -> expansion

    def structure(self, reader: Any) -> None:
        """Count the objects pypdf would parse (cross-reference entries; all an object stream
        packs, ``/N``, when one is read) and decode the object streams, so that their bytes
        count (pypdf keeps them, decoded, as long as the reader)."""
        top = sum(len(entries) for entries in reader.xref.values())
        self.objects = top + len(reader.xref_objStm)
        if self.objects > self.left["objects"]:
            raise _TooLarge(_WHY["objects"])
        self.objects, packed_bytes = top, 0
        for number in dict.fromkeys(stream for stream, _ in reader.xref_objStm.values()):
            packed = reader.get_object(number)
            count = _get(packed, "/N")
            self.objects += max(count, 1) if isinstance(count, int) else 1
            if self.objects > self.left["objects"]:
                raise _TooLarge(_WHY["objects"])
            packed_bytes += len(self.data(packed)) if _is_stream(packed) else 0
            if packed_bytes > MAX_STRUCTURE_BYTES:
                raise _TooLarge(f"pack more than {MAX_STRUCTURE_BYTES} bytes of objects")

    def document(self, reader: Any) -> PdfCost:
        pages = reader.pages
        count = len(pages)
        self.opened = count > 0
        if count == 0:
            raise _Unreadable("it has no pages")
        if count > self.left["pages"]:
            raise _TooLarge(_WHY["pages"])
        text = sum(self.page(page) for page in pages)
        text += self.strings(reader.trailer.get("/Info"))
        return PdfCost(count, text, self.decoded, self.objects, self.steps)

    def touch(self) -> None:
        self.steps += 1
        if self.steps > self.left["steps"]:
            raise _TooLarge(_WHY["steps"])

    def data(self, stream: Any) -> bytes:
        """A stream's decoded bytes, charged once per document."""
        raw: bytes = stream.get_data()
        if id(stream) not in self.lengths:
            self.lengths[id(stream)] = len(raw)
            self.decoded += len(raw)
            if self.decoded > self.left["decoded_bytes"]:
                raise _TooLarge(_WHY["decoded_bytes"])
        return raw

    def page(self, page: Any) -> int:
        """A bound on the tokens of one page's text (see the module docstring)."""
        self.touch()
        resources = _dict(page, "/Resources")
        tokens = 0
        contents = _streams(_get(page, "/Contents"))  # one stream may be listed often
        parse = True
        if len(contents) > 1:
            # Its streams are one content (a string may begin in one and end in the next):
            # parsed joined, or, past the parse cap, each counted by its bytes.
            size = sum(len(self.data(content)) for content in contents)
            if self.parsed + size <= MAX_PARSED_BYTES:
                contents = [self.joined(contents)]
            else:
                parse = False
        for content in contents:
            self.touch()
            tokens += self.form(content, resources, 0, frozenset(), own=False, parse=parse)
        for annotation in _array(page, "/Annots"):
            self.touch()
            note = annotation if isinstance(annotation, dict) else _NONE
            tokens += sum(self.strings(_get(note, k)) for k in ("/Contents", "/T", "/TU", "/RC"))
            normal = _get(_dict(note, "/AP"), "/N")
            for form in [normal] if _is_stream(normal) else _values(normal):
                if _is_stream(form):
                    tokens += self.form(form, resources, 1, frozenset())
        return tokens

    def joined(self, contents: list[Any]) -> Any:
        """A page's content streams as one stream (each charged once, as it was read)."""
        key = tuple(id(content) for content in contents)
        if key not in self.joins:
            from pypdf.generic import DecodedStreamObject

            joined = DecodedStreamObject()
            joined.set_data(b"\n".join(self.data(content) for content in contents))
            self.lengths[id(joined)] = 0  # its bytes were charged as its streams
            self.joins[key] = joined
        return self.joins[key]

    def form(
        self, form: Any, outer: _Res, depth: int, path: _Path, own: bool = True, parse: bool = True
    ) -> int:
        """The tokens of the text a content stream (a page's, or a form XObject's, pattern's or
        appearance's, with its own resources if it has them) draws each time it runs, with the
        forms it names."""
        self.touch()
        if id(form) in path:
            raise _Unreadable("a form draws itself")
        if depth > MAX_FORM_DEPTH:
            raise _TooLarge(f"nest forms more than {MAX_FORM_DEPTH} deep")
        mine = _get(form, "/Resources") if own else None
        resources = mine if isinstance(mine, dict) else outer
        key = (id(form), id(resources), parse)
        if key not in self.forms:
            content, path = self.data(form), path | {id(form)}
            fonts = _dict(resources, "/Font")
            total = self.text(form, content, fonts) if parse else self.unparsed(content, fonts)
            forms = self.forms_of(_dict(resources, "/XObject"))
            # Counting each name is a scan of the content: past a few, every Do may draw any.
            each = bool(forms) and (
                len(forms) * len(content) > _SCAN_BUDGET or _ESCAPED_NAME.search(content)
            )
            for name, child in forms:
                uses = content.count(b"Do") if each else content.count(name)
                if uses:
                    total += uses * self.form(child, resources, depth + 1, path)
            for pattern in _values(_dict(resources, "/Pattern")):
                if _is_stream(pattern) and _get(pattern, "/PatternType") == 1:
                    total += self.form(pattern, resources, depth + 1, path)
            self.forms[key] = total
        return self.forms[key]

    def text(self, form: Any, content: bytes, fonts: dict[str, Any]) -> int:
        """The tokens of the strings ``content``'s text operators show, each through the font
        it is shown in (see the module docstring)."""
        widest = self.expansion(fonts)
        if not _SHOWS.search(content):
            return 0  # no operator that shows text: nothing to parse
        if self.parsed + len(content) > MAX_PARSED_BYTES:
            return self.unparsed(content, fonts)
        self.parsed += len(content)
        from pypdf.generic import ContentStream

        try:
            operations = ContentStream(form, None).operations
        except Exception:  # content pypdf cannot parse: every byte, as if unparsed
            return self.unparsed(content, fonts)
        shown: _Shown = widest
        tokens, text = 0, list[str]()  # strings decoded by a table: bounded together, as text
        for operands, operator in operations:
            if operator == b"Tf" and operands:
                font = _resolve(fonts.get(str(operands[0])))
                shown = self.shown(font) if isinstance(font, dict) else widest
            elif operator in (b"Tj", b"'", b'"') and operands:
                tokens += _shown(operands[-1], shown, text)
            elif operator == b"TJ" and operands and isinstance(operands[0], list):
                for item in operands[0]:  # a number may be a space to an extractor
                    tokens += _shown(item, shown, text) if _is_string(item) else _space(text)
            if operator in _TEXT_OPERATORS:
                text.append("\n")  # the line break (or space) an extractor may put here
        return tokens + input_text_tokens("".join(text))

    def unparsed(self, content: bytes, fonts: dict[str, Any]) -> int:
        """Content not parsed: every byte, as a string of the widest font it may use."""
        return math.ceil(len(content) * self.expansion(fonts))

    def shown(self, font: dict[str, Any]) -> _Shown:
        """How ``font``'s strings count: the table of its standard encoding when that is all
        that maps its bytes to text, else the most a byte becomes with it."""
        table = _standard_table(font)
        if table is not None:
            return table
        if id(font) not in self.expansions:
            self.expansions[id(font)] = self.font(font)
        return self.expansions[id(font)]

    def forms_of(self, xobjects: dict[str, Any]) -> list[tuple[bytes, Any]]:
        """The form XObjects of an /XObject dictionary, with their names as a content stream
        spells them plainly (images are skipped: no text, and never decoded)."""
        known = self.form_lists.get(id(xobjects))
        if known is None:
            known = []
            for name, value in xobjects.items():
                self.touch()
                form = _resolve(value)
                if _is_stream(form) and _get(form, "/Subtype") == "/Form":
                    plain = _PLAIN_NAME.fullmatch(str(name))
                    # A name that is not plain ASCII matches no plain spelling: every Do.
                    known.append((str(name).encode("ascii") if plain else b"Do", form))
            self.form_lists[id(xobjects)] = known
        return known

    def expansion(self, fonts: dict[str, Any]) -> float:
        """The most a drawn byte can become as text (UTF-8 bytes) with any of ``fonts``."""
        most = self.expansions.get(id(fonts))
        if most is None:
            most = BYTE_EXPANSION
            for font in _values(fonts):
                if isinstance(font, dict):
                    if id(font) not in self.expansions:
                        self.expansions[id(font)] = self.font(font)
                    most = max(most, self.expansions[id(font)])
            self.expansions[id(fonts)] = most
        return most

    def font(self, font: dict[str, Any]) -> float:
        self.touch()
        encoding = _get(font, "/Encoding")
        identity = _get(font, "/Subtype") == "/Type0" and encoding in _IDENTITY
        code = 2 if identity else 1  # bytes per code, at least
        most = IDENTITY_FONT_EXPANSION if identity else SIMPLE_FONT_EXPANSION
        cmap = _get(font, "/ToUnicode")
        if _is_stream(cmap):  # every hex string of it, sources too: a bound on destinations
            for hexits in _HEX.findall(self.data(cmap)):  # 2 bytes are one character at most
                most = max(most, _utf8_length(hexits) / code) if len(hexits) > 4 else most
        names: list[str] = [n for n in _array(encoding, "/Differences") if isinstance(n, str)]
        descriptor = _dict(font, "/FontDescriptor")
        program = _get(descriptor, "/FontFile")
        if _is_stream(program):  # a Type 1 program's own encoding, in its clear part
            clear = self.data(program).split(b"eexec")[0].partition(b"/Encoding")[2]
            names += [(b"/" + name).decode("latin-1") for name in _NAME.findall(clear)]
        if _is_stream(_get(descriptor, "/FontFile3")):  # a CFF program's names, unread
            most = max(most, _LONGEST_GLYPH)
        return max([most, *(_glyph_bytes(name) for name in names)])

    def strings(self, value: Any) -> int:
        """The UTF-8 bytes of a string, or of the strings among a dictionary's values."""
        value = _resolve(value)
        if isinstance(value, str):
            return len(value.encode("utf-8", "surrogatepass"))
        if isinstance(value, bytes):
            return len(value)
        if isinstance(value, dict):
            self.touch()
            return sum(self.strings(v) for v in _values(value) if isinstance(v, str | bytes))
        return 0


_IDENTITY = ("/Identity-H", "/Identity-V")
_SHOWS = re.compile(rb"T[jJ]|['\"]")  # where a text-showing operator may be
_TEXT_OPERATORS = frozenset({b"Tj", b"TJ", b"'", b'"', b"Td", b"TD", b"Tm", b"T*"})
_SIMPLE = ("/Type1", "/TrueType", "/MMType1")
_BASE14_TEXT = frozenset(
    f"/{family}{style}"
    for family, styles in (
        ("Helvetica", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("Courier", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("Times", ("-Roman", "-Bold", "-Italic", "-BoldItalic")),
    )
    for style in styles
)


def _standard_table(font: dict[str, Any]) -> list[str] | None:
    """The 256 characters a simple font's codes are extracted as, when only a standard
    encoding maps them (pypdf's own tables); None when anything else may (a /ToUnicode CMap,
    /Differences, an embedded program's encoding, a composite or Type 3 font)."""
    if _get(font, "/Subtype") not in _SIMPLE or _get(font, "/ToUnicode") is not None:
        return None
    descriptor = _dict(font, "/FontDescriptor")
    if any(_get(descriptor, k) is not None for k in ("/FontFile", "/FontFile2", "/FontFile3")):
        return None
    encoding = _get(font, "/Encoding")
    if encoding is None:  # a standard font's own encoding: Standard, for the text faces
        encoding = "/StandardEncoding" if _get(font, "/BaseFont") in _BASE14_TEXT else None
    try:
        from pypdf._codecs import _mac_encoding, _std_encoding, _win_encoding
    except ImportError:  # a private module of pypdf: without it, the expansion holds
        return None
    tables = {
        "/WinAnsiEncoding": _win_encoding,
        "/MacRomanEncoding": _mac_encoding,
        "/StandardEncoding": _std_encoding,
    }
    table = tables.get(encoding) if isinstance(encoding, str) else None
    return list(table) if table is not None and len(table) == 256 else None


def _is_string(value: Any) -> bool:
    return isinstance(value, bytes) or (isinstance(value, str) and hasattr(value, "original_bytes"))


def _shown(string: Any, shown: _Shown, text: list[str]) -> int:
    """One shown string: decoded by a table into ``text`` (bounded with the rest of it), or
    its bytes times an expansion, returned as tokens; what is not a string shows nothing."""
    if isinstance(string, str) and hasattr(string, "original_bytes"):
        raw: bytes = string.original_bytes
    elif isinstance(string, bytes):
        raw = bytes(string)
    else:
        return 0
    if isinstance(shown, list):
        text.append("".join(shown[b] for b in raw))
        return 0
    return math.ceil(len(raw) * float(shown))


def _space(text: list[str]) -> int:
    text.append(" ")
    return 0


_SCAN_BUDGET = 64 * 1024 * 1024  # bytes of content scanned for names, per content stream
_HEX = re.compile(rb"<([0-9A-Fa-f\s]*)>")
_NAME = re.compile(rb"/([^\s()<>\[\]{}/%]+)")
_LONGEST_GLYPH = 10  # UTF-8 bytes of the longest string of the Adobe Glyph List
_ESCAPED_NAME = re.compile(rb"/[^\s()<>\[\]{}/%]*#")
_PLAIN_NAME = re.compile(r"/[!-~]+")


def _glyph_bytes(name: str) -> int:
    """The UTF-8 bytes an extractor makes of a glyph name: the Adobe Glyph List's string, a code
    point (``/uniXXXX``), else (pypdf) the name itself. No string of the list is longer than 4
    bytes or its name, so without the list (a private module of pypdf) the bound holds."""
    try:
        from pypdf._codecs.adobe_glyphs import adobe_glyphs
    except ImportError:
        adobe_glyphs = {}
    known = adobe_glyphs.get(name)
    length = len(name.encode("utf-8", "surrogatepass"))
    return len(known.encode("utf-8", "surrogatepass")) if known else max(4, length)


def _utf8_length(hexits: bytes) -> int:
    """UTF-8 bytes of a CMap hex string read as UTF-16BE text (a destination's)."""
    digits = re.sub(rb"\s", b"", hexits)
    raw = bytes.fromhex((digits + b"0" * (len(digits) % 2)).decode("ascii"))
    raw += b"\x00" * (len(raw) % 2)
    return len(raw.decode("utf-16-be", "surrogatepass").encode("utf-8", "surrogatepass"))


def _resolve(value: Any) -> Any:
    return value.get_object() if hasattr(value, "get_object") else value


def _get(container: Any, key: str) -> Any:
    """``container[key]`` resolved, or None (a dictionary's ``get`` does not resolve)."""
    container = _resolve(container)
    return _resolve(container.get(key)) if isinstance(container, dict) else None


def _dict(container: Any, key: str) -> dict[str, Any]:
    value = _get(container, key)
    return value if isinstance(value, dict) else _NONE  # one object: memos key on identity


def _array(container: Any, key: str) -> list[Any]:
    value = _get(container, key)
    return [_resolve(v) for v in value] if isinstance(value, list) else []


def _values(container: Any) -> list[Any]:
    container = _resolve(container)
    return [_resolve(v) for v in container.values()] if isinstance(container, dict) else []


def _is_stream(value: Any) -> bool:
    return isinstance(value, dict) and hasattr(value, "get_data")


def _streams(value: Any) -> list[Any]:
    """A page's /Contents: one stream or an array of them."""
    items = [value] if _is_stream(value) else value if isinstance(value, list) else []
    return [s for s in map(_resolve, items) if _is_stream(s)]
