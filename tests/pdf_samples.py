"""PDFs for the tests, built here: by pypdf's writer, or byte by byte where a test needs what a
writer never produces (a comment inside a page's /Type, pages inside an object stream, one
content stream shared by every page, a compressed 120 KB text stream, a decompression bomb).

Every page has a font (Helvetica, WinAnsiEncoding) and shows its text with ``'`` (next line,
show), so pypdf's text extraction, which the mock bills, reads it back line by line.
"""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Sequence

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

PROSE = (
    "The committee met on Tuesday to review the quarterly figures. Revenue rose in every "
    "region but one, and the board asked for a plan to close the gap before the next review. "
)
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


def text_content(text: str, width: int = 90) -> bytes:
    """A content stream that shows ``text`` in lines of ``width`` characters."""
    raw = text.encode("cp1252")
    lines = [raw[i : i + width] for i in range(0, len(raw), width)]
    shown = b"\n".join(b"(" + _escape(line) + b") '" for line in lines)
    return b"BT /F1 9 Tf 11 TL 36 760 Td\n" + shown + b"\nET"


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def stream(data: bytes, *, compress: bool = False, extra: bytes = b"") -> bytes:
    """The body of a stream object holding ``data``, Flate-compressed then hex-encoded if asked
    (two standard filters: the file stays ASCII, so no byte of it can look like a name's ``#``
    escape to a regex)."""
    if compress:
        data = zlib.compress(data, 9).hex().encode() + b">"
        extra += b" /Filter [/ASCIIHexDecode /FlateDecode]"
    return b"<< /Length %d%s >>\nstream\n%s\nendstream" % (len(data), extra, data)


def build(objects: Sequence[bytes], *, packed: Sequence[int] = (), header: bool = True) -> bytes:
    """A PDF of ``objects`` (object ``i + 1`` is ``objects[i]``, the catalog is object 1).

    Objects whose numbers are in ``packed`` go into one compressed object stream, and the
    cross-reference table is then a compressed cross-reference stream (PDF 1.5)."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" if header else b"")
    offsets: dict[int, tuple[int, int, int]] = {}  # number -> (type, field 2, field 3)
    for number, body in enumerate(objects, 1):
        if number not in packed:
            offsets[number] = (1, len(out), 0)
            out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    size = len(objects) + 1
    if not packed:
        xref = len(out)
        out += b"xref\n0 %d\n0000000000 65535 f \n" % size
        out += b"".join(b"%010d 00000 n \n" % offsets[n][1] for n in range(1, size))
        out += b"trailer\n<< /Size %d /Root 1 0 R >>\n" % size
        return bytes(out + b"startxref\n%d\n%%%%EOF\n" % xref)
    stm, xref_number = size, size + 1
    heads, bodies, at = [], [], 0
    for index, number in enumerate(packed):
        heads.append(b"%d %d" % (number, at))
        offsets[number] = (2, stm, index)
        bodies.append(objects[number - 1] + b"\n")
        at += len(bodies[-1])
    first = b" ".join(heads) + b"\n"
    extra = b" /Type /ObjStm /N %d /First %d" % (len(packed), len(first))
    offsets[stm] = (1, len(out), 0)
    packed_stream = stream(first + b"".join(bodies), compress=True, extra=extra)
    out += b"%d 0 obj\n%s\nendobj\n" % (stm, packed_stream)
    offsets[xref_number] = (1, len(out), 0)
    rows = [b"\x00\x00\x00\x00\x00\x00\x00\xff\xff"]
    for number in range(1, xref_number + 1):
        kind, a, b = offsets[number]
        rows.append(bytes([kind]) + a.to_bytes(4, "big") + b.to_bytes(4, "big"))
    extra = b" /Type /XRef /Size %d /W [1 4 4] /Root 1 0 R" % (xref_number + 1)
    xref = len(out)
    out += b"%d 0 obj\n%s\nendobj\n" % (
        xref_number,
        stream(b"".join(rows), compress=True, extra=extra),
    )
    return bytes(out + b"startxref\n%d\n%%%%EOF\n" % xref)


def pages_pdf(
    contents: Sequence[bytes],
    *,
    compress: bool = False,
    page_type: bytes = b"/Type /Page",
    in_object_stream: bool = False,
) -> bytes:
    """One page per content stream; ``page_type`` is how each page says what it is."""
    n = len(contents)
    kids = b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n),
        FONT,
    ]
    for i, content in enumerate(contents):
        objects.append(
            b"<< %s /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>" % (page_type, 5 + 2 * i)
        )
        objects.append(stream(content, compress=compress))
    # Every object but the content streams (a stream cannot be in an object stream).
    packed = [n for n in range(1, len(objects) + 1) if n % 2 == 0 or n < 4]
    return build(objects, packed=packed if in_object_stream else ())


def shared_stream_pdf(
    pages: int,
    content: bytes,
    *,
    page_type: bytes = b"/Type /Page",
    in_object_stream: bool = False,
) -> bytes:
    """``pages`` pages whose /Contents are all the one compressed stream ``content``: small
    files of many pages."""
    kids = b" ".join(b"%d 0 R" % (6 + i) for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        FONT,
        stream(content, compress=True),
        b"<< /Font << /F1 3 0 R >> >>",
    ]
    page = b"<< %s /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources 5 0 R >>"
    objects += [page % page_type] * pages
    packed = [n for n in range(1, len(objects) + 1) if n != 4]
    return build(objects, packed=packed if in_object_stream else ())


def attacks() -> dict[str, bytes]:
    """The issue's ways past the cap with a PDF, and the parser's own: each is billed far more
    than the bytes of its file, and a regex on ``/Type /Page`` undercounts it."""
    return {
        "120 KB of text in one compressed stream": compressed_text_pdf(),
        "100 pages written /Type %c<newline>/Page": pages_pdf(
            [text_content(prose(200))] * 100, page_type=b"/Type %c\n/Page"
        ),
        "40 pages sharing one content stream": shared_stream_pdf(40, text_content(prose(3000))),
        "60 pages written by pypdf": written_pdf([text_content(prose(1500))] * 60),
        "150 pages in an object stream": pages_pdf(
            [text_content(prose(300))] * 150, in_object_stream=True
        ),
        "150 pages encrypted (RC4, empty user password)": written_pdf(
            [text_content(prose(400))] * 150, password="owner"
        ),
    }


def written_pdf(
    contents: Sequence[bytes], *, password: str | None = None, user_password: str = ""
) -> bytes:
    """The same pages written by pypdf's writer (compressed streams), encrypted with RC4-128
    when ``password`` (the owner's) is given, with ``user_password`` (empty: anyone opens it)."""
    writer = PdfWriter()
    for content in contents:
        page = writer.add_blank_page(612, 792)
        data = DecodedStreamObject()
        data.set_data(content)
        page[NameObject("/Contents")] = writer._add_object(data.flate_encode())
        font = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
                NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),
            }
        )
        fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
    if password is not None:
        writer.encrypt(user_password=user_password, owner_password=password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def data_url(pdf: bytes, media: str = "application/pdf") -> str:
    return f"data:{media};base64,{base64.b64encode(pdf).decode()}"


def prose(chars: int) -> str:
    """``chars`` characters of repetitive English (it compresses about 60 to 1)."""
    return (PROSE * (chars // len(PROSE) + 1))[:chars]


def compressed_text_pdf(chars: int = 120_000) -> bytes:
    """The issue's first case: one page whose text sits in one compressed content stream."""
    return pages_pdf([text_content(prose(chars))], compress=True)
