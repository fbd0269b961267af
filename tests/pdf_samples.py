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


# -- real-shaped documents: what a tenant sends, to see how near its bill a document is held ----

BOLD = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>"
WORDS = PROSE.split()


def _sentences(seed: int, chars: int) -> str:
    """Varied English of about ``chars`` characters (seeded: not one sentence repeated)."""
    import random

    rng, out = random.Random(seed), []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def _lines(text: str, width: int) -> list[bytes]:
    raw = text.encode("cp1252")
    return [_escape(raw[i : i + width]) for i in range(0, len(raw), width)]


def _first(seed: int, chars: int) -> bytes:
    """One line of about ``chars`` characters of varied English, escaped for a PDF string."""
    return _lines(_sentences(seed, chars), chars)[0]


def document(pages: Sequence[bytes], *, box: bytes = b"[0 0 612 792]", extra: bytes = b"") -> bytes:
    """Pages of compressed content sharing two fonts (F1 regular, F2 bold) and a 200 x 250
    grayscale image (Im1, noise: a scan's compressed bytes), each page's resources all three;
    ``extra`` goes into every page's dictionary."""
    import random

    noise = random.Random(7).randbytes(200 * 250)
    image = stream(
        zlib.compress(noise),
        extra=b" /Type /XObject /Subtype /Image /Width 200 /Height 250 /ColorSpace /DeviceGray"
        b" /BitsPerComponent 8 /Filter /FlateDecode",
    )
    n = len(pages)
    kids = b" ".join(b"%d 0 R" % (6 + 2 * i) for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n),
        FONT,
        BOLD,
        image,
    ]
    for i, content in enumerate(pages):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox %s /Contents %d 0 R /Resources << /Font "
            b"<< /F1 3 0 R /F2 4 0 R >> /XObject << /Im1 5 0 R >> >> %s >>"
            % (box, 7 + 2 * i, extra)
        )
        objects.append(stream(content, compress=True))
    return build(objects)


def report(pages: int = 6) -> bytes:
    """A report: a bold heading, about 3,000 characters of body text in 95-character lines
    (some kerned with TJ), a ruled table of figures, a page number."""
    out = []
    for p in range(pages):
        body = _lines(_sentences(p, 3_000), 95)
        shown = b"".join(
            (b"[(" + line[:40] + b") -12 (" + line[40:] + b")] TJ T*\n") if i % 4 == 0
            else (b"(" + line + b") '\n")
            for i, line in enumerate(body)
        )  # fmt: skip
        table = b"".join(
            b"BT /F1 9 Tf %d %d Td (%d.%02d) Tj ET\n" % (72 + 120 * c, 200 - 14 * r, r * 37 + c, c)
            for r in range(8) for c in range(4)
        )  # fmt: skip
        rules = b"".join(b"72 %d m 540 %d l S\n" % (210 - 14 * r, 210 - 14 * r) for r in range(9))
        out.append(
            b"BT /F2 16 Tf 72 740 Td (Section %d: Quarterly review) Tj ET\n" % (p + 1)
            + b"BT /F1 10 Tf 12 TL 72 710 Td\n" + shown + b"ET\n" + b"0.5 w\n" + rules + table
            + b"BT /F1 8 Tf 300 40 Td (Page %d of %d) Tj ET" % (p + 1, pages)
        )  # fmt: skip
    return document(out)


def slides(pages: int = 8) -> bytes:
    """A slide deck (16:9): a big title, four bullets, a filled background and drawn shapes."""
    out = []
    for p in range(pages):
        shapes = b"".join(
            b"%.2f %.2f %.2f rg %d %d 120 80 re f\n" % (0.1 * (i % 9), 0.3, 0.6, 60 + 140 * i, 60)
            for i in range(6)
        )
        curves = b"".join(
            b"%d 300 m %d 380 %d 220 %d 300 c S\n" % (x, x + 40, x + 80, x + 120)
            for x in range(40, 900, 60)
        )
        bullets = b"".join(
            b"BT /F1 24 Tf 80 %d Td (- %s) Tj ET\n" % (400 - 50 * b, _first(100 * p + b, 60))
            for b in range(4)
        )  # fmt: skip
        out.append(
            b"0.95 0.95 0.97 rg 0 0 960 540 re f\n" + shapes + curves
            + b"BT /F2 40 Tf 80 470 Td (Slide %d: %s) Tj ET\n" % (p + 1, _first(p, 30))
            + bullets
        )  # fmt: skip
    return document(out, box=b"[0 0 960 540]")


def scan(pages: int = 3) -> bytes:
    """A scanned document: every page one image, no text."""
    return document([b"q 612 0 0 792 0 0 cm /Im1 Do Q"] * pages)


def form(fields: int = 24) -> bytes:
    """A filled-in form: labels in the page's content, and each field a widget annotation with
    its name, its value and an appearance stream that shows the value."""
    labels = b"".join(
        b"BT /F1 10 Tf 72 %d Td (Field %d, %s:) Tj ET\n" % (740 - 28 * i, i, _first(900 + i, 12))
        for i in range(fields)
    )  # fmt: skip
    # the widgets are objects 8.. and listed by the page (object 6)
    objects = []
    refs = []
    for i in range(fields):
        value = _lines(_sentences(500 + i, 30), 30)[0]
        appearance = stream(
            b"/Tx BMC BT /F1 10 Tf 2 4 Td (" + value + b") Tj ET EMC",
            extra=b" /Type /XObject /Subtype /Form /BBox [0 0 200 18]"
            b" /Resources << /Font << /F1 3 0 R >> >>",
        )
        number = 8 + 2 * i
        objects.append(
            b"<< /Type /Annot /Subtype /Widget /FT /Tx /Rect [250 %d 450 %d] /T (field_%d) /V (%s)"
            b" /AP << /N %d 0 R >> >>" % (736 - 28 * i, 754 - 28 * i, i, value, number + 1)
        )
        objects.append(appearance)
        refs.append(b"%d 0 R" % number)
    base = [
        b"<< /Type /Catalog /Pages 2 0 R /AcroForm << /Fields [%s] >> >>" % b" ".join(refs),
        b"<< /Type /Pages /Kids [6 0 R] /Count 1 >>",
        FONT,
        BOLD,
        b"<< >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 7 0 R /Resources << /Font"
        b" << /F1 3 0 R /F2 4 0 R >> >> /Annots [%s] >>" % b" ".join(refs),
        stream(labels, compress=True),
    ]
    return build(base + objects)


def corpus() -> dict[str, bytes]:
    """The real-shaped documents: a report, slides, a scan, a form."""
    return {"report (6 pages)": report(), "slides (8 pages)": slides(), "scan (3 pages)": scan(),
            "form (24 fields)": form()}  # fmt: skip
