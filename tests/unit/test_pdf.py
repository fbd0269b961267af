"""What a PDF costs (hardcap_core/wire/pdf.py): pages from pypdf's page tree, whatever the file
does to hide them; a text bound never below what the mock bills (pypdf's extracted text by
cl100k_base); a 400 naming the field for what cannot be read; bombs refused with a 400; the
route's page cap; pypdf imported only for a PDF."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pydantic
import pytest

from hardcap_core.config import parse_config
from hardcap_core.config.schema import RouteConfig
from hardcap_core.errors import InvalidRequest
from hardcap_core.local.mock_anthropic import image_limits, page_image_tokens
from hardcap_core.local.mock_billing import billed_image_rules, pdf_pages, text_tokens
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.tokenize.images import ALL_RULES, bill, largest, rules_for
from hardcap_core.tokenize.routes import InputCounts
from hardcap_core.wire import pdf
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.openai_input import check_pdf_pages, input_tokens
from hardcap_core.wire.openai_request import parse_chat_request
from hardcap_core.wire.pdf import MAX_DECODED_BYTES, PARSE_PAGE_IMAGE_TOKENS, Allowance, pdf_cost
from tests.pdf_samples import (
    FONT,
    build,
    compressed_text_pdf,
    corpus,
    data_url,
    pages_pdf,
    prose,
    scan,
    shared_stream_pdf,
    stream,
    text_content,
    written_pdf,
)

WHERE = "messages[0].content[0].file.file_data"
CATALOG = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>"]
THRICE = b"<< /Type /Pages /Kids [3 0 R 3 0 R 3 0 R] /Count 1 >>"
PAGE = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources %s >>"


def cost(data: bytes, *, declared: bool = True) -> pdf.PdfCost | None:
    pdf._cache.clear()  # each test reads its document, not an answer kept from another
    return pdf_cost(data, WHERE, Allowance(), declared=declared)


def refused(data: bytes, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as caught:
        cost(data)
    assert caught.value.param == WHERE


def body(*files: tuple[str, str | None]) -> dict[str, Any]:
    """A user message of a text part and a file part per (data URL, filename)."""
    parts: list[Any] = [{"type": "text", "text": "Summarize."}]
    for url, name in files:
        file = {"file_data": url} | ({"filename": name} if name else {})
        parts.append({"type": "file", "file": file})
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def billed_text(data: bytes) -> int:
    """What the mock bills for the text of every page (cl100k_base on pypdf's extraction)."""
    pages = pdf_pages(data)
    assert pages is not None
    return sum(text_tokens(text) for text, _ in pages)


def one_page(resources: bytes, content: bytes, *more: bytes) -> bytes:
    """A one-page PDF: the page (object 3), its content (4), then ``more`` from object 5."""
    return build([*CATALOG, PAGE % resources, stream(content, compress=True), *more])


# -- pages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "pages"),
    [
        (pages_pdf([b""] * 3), 3),
        (pages_pdf([b""] * 100, page_type=b"/Type %c\n/Page"), 100),  # a comment is whitespace
        (pages_pdf([b""] * 100, page_type=b"/Type /P#61ge"), 100),  # an escaped name
        (pages_pdf([b""] * 150, in_object_stream=True), 150),
        (written_pdf([b""] * 60), 60),
        (written_pdf([b""] * 7, password="owner"), 7),  # RC4, the empty user password
        (pages_pdf([b""] * 5)[len(b"%PDF-1.7\n") :], 5),  # no header: readers still read it
        (build([CATALOG[0], THRICE, b"<< /Type /Page /Parent 2 0 R >>"]), 3),  # one page, 3 kids
    ],
    ids=["plain", "comment", "escaped", "object stream", "pypdf", "rc4", "headerless", "twice"],
)
def test_pages_are_counted_from_the_page_tree(data: bytes, pages: int) -> None:
    found = cost(data, declared=False)
    assert found is not None and found.pages == pages


# -- the text bound -------------------------------------------------------------------------------


def test_compressed_text_counts_what_it_decodes_to() -> None:
    # 120 KB of text in a 3.5 KB file: held 465,752 tokens when every decoded byte counted
    # 3 (a token per UTF-8 byte its font could make), billed 26,903 for its text.
    data = compressed_text_pdf()
    found, billed = cost(data), billed_text(data)
    assert len(data) < 4_000 and found is not None
    assert billed <= found.text_tokens <= 3.2 * billed and found.text_tokens > 20 * len(data)


def test_a_shared_content_stream_counts_for_every_page() -> None:
    content = text_content(prose(3000))
    data = shared_stream_pdf(40, content)
    found = cost(data)
    assert found is not None and found.pages == 40
    alone = cost(shared_stream_pdf(1, content))
    assert alone is not None and found.text_tokens >= 40 * alone.text_tokens
    assert found.text_tokens >= billed_text(data)


def form_pdf(uses: int, text: bytes, name: bytes = b"/Fm1") -> bytes:
    """One page that draws a form XObject showing ``text``, ``uses`` times."""
    draws = b"".join(b"q 1 0 0 1 0 %d cm %s Do Q\n" % (-i, name) for i in range(uses))
    form = stream(
        b"BT /F1 9 Tf 36 700 Td (" + text + b") Tj ET",
        extra=b" /Type /XObject /Subtype /Form /BBox [0 0 612 792]"
        b" /Resources << /Font << /F1 6 0 R >> >>",
    )
    return one_page(b"<< /XObject << /Fm1 5 0 R >> >>", draws, form, FONT)


@pytest.mark.parametrize("name", [b"/Fm1", b"/F#6d1"], ids=["plain", "escaped"])
def test_a_form_counts_every_time_it_is_drawn(name: bytes) -> None:
    data = form_pdf(200, prose(2000).encode(), name)
    found = cost(data)
    assert found is not None and found.text_tokens >= 200 * input_text_tokens(prose(2000))
    assert found.text_tokens >= billed_text(data) >= 200 * 300


def test_a_cmap_that_maps_a_byte_to_a_long_string_counts_the_string() -> None:
    # 2,000 bytes drawn, each extracted as 256 characters: 512,000 characters of text.
    cmap = (
        b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
        b"1 begincodespacerange <00> <FF> endcodespacerange\n"
        b"1 beginbfchar <41> <" + b"0078" * 256 + b"> endbfchar\nendcmap end end"
    )
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /ToUnicode 6 0 R >>"
    content = b"BT /F1 9 Tf 36 700 Td (" + b"A" * 2000 + b") Tj ET"
    data = one_page(b"<< /Font << /F1 5 0 R >> >>", content, font, stream(cmap, compress=True))
    found, billed = cost(data), billed_text(data)
    assert found is not None and billed > 50_000
    assert found.text_tokens >= billed


def test_a_glyph_name_a_reader_does_not_know_counts_as_itself() -> None:
    # pypdf shows a glyph name it does not know as the name: 40 characters a byte drawn.
    font = (
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding << /Type /Encoding "
        b"/Differences [65 /" + b"x" * 39 + b"] >> >>"
    )
    content = b"BT /F1 9 Tf 36 700 Td (" + b"A" * 3000 + b") Tj ET"
    data = one_page(b"<< /Font << /F1 5 0 R >> >>", content, font)
    found, billed = cost(data), billed_text(data)
    assert found is not None and billed > 10_000
    assert found.text_tokens >= billed


def test_an_annotations_text_counts() -> None:
    note = b"<< /Type /Annot /Subtype /Text /Rect [0 0 9 9] /Contents (%s) >>"
    data = build(
        [*CATALOG, b"<< /Type /Page /Parent 2 0 R /Annots [4 0 R] >>", note % prose(5000).encode()]
    )
    found = cost(data)
    assert found is not None and found.text_tokens >= 5000


def test_each_page_adds_an_image_gpt_4o_s_largest_at_parse_or_the_one_given() -> None:
    found = cost(written_pdf([b""] * 4))
    assert found is not None
    assert PARSE_PAGE_IMAGE_TOKENS == 85 + 170 * 8
    assert found.tokens() == found.text_tokens + 4 * 1_445
    assert found.tokens(4_784) == found.text_tokens + 4 * 4_784


# -- the image of each page: the route's model's ----------------------------------------------

ONE_PAGE = pages_pdf([text_content("Quarterly figures.")])
# The most one image of any size costs, by the route's model: Claude up to 4.6 (1,568 px),
# Claude Opus 4.7 (2,576 px), gpt-4.1-nano's 1,536 patches x 2.46, GPT-4o's 8 tiles; a model of
# no known family every rule's dearest (gpt-4o-mini's 2,833 + 8 x 5,667), as its images are.
PAGE_IMAGE = {
    ("claude-sonnet-4-5", "anthropic"): 1_640,
    ("claude-3-5-haiku-20241022", "anthropic"): 1_640,
    ("claude-opus-4-7", "anthropic"): 4_784,
    ("anthropic.claude-sonnet-4-5-20250929-v1:0", "bedrock"): 1_640,
    ("gpt-4.1-nano", "openai"): 3_779,
    ("gpt-4o", "openai"): 1_445,
    ("llama-3.3-70b-vision", "openai"): 2_833 + 8 * 5_667,
}


def route_counts(model: str, kind: str, fallbacks: tuple[str, ...] = ()) -> InputCounts:
    """Routes ``r`` on ``model`` (an upstream of ``kind``), falling back to routes named by
    the models in ``fallbacks``, each on an upstream of its own kind."""
    kinds = {"anthropic": {"kind": "anthropic"}, "openai": {}, "bedrock": {"kind": "bedrock"}}
    upstreams = [
        {"name": k, "base_url": "http://127.0.0.1:1/v1", **extra}
        | ({"region": "us-east-1"} if k == "bedrock" else {})
        for k, extra in kinds.items()
    ]
    routes = [{"name": "r", "upstream": kind, "model": model, "fallbacks": list(fallbacks)}]
    routes += [{"name": m, "upstream": "openai", "model": m} for m in fallbacks]
    config = {"gateway": {"redis_url": "redis://127.0.0.1:1"}, "upstreams": upstreams}
    return InputCounts(parse_config(config | {"routes": routes}))


def held(counts: InputCounts, data: bytes, *, anthropic: bool = False) -> tuple[int, int]:
    """The hold of a request carrying ``data`` as its one file on route ``r``, and what the
    parse counted for it."""
    if anthropic:
        source = {"type": "base64", "media_type": "application/pdf"}
        block = {"type": "document", "source": source | {"data": data_url(data).partition(",")[2]}}
        raw = {"model": "r", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
        chat = parse_messages_request(json.dumps(raw).encode())
    else:
        file = {"filename": "report.pdf", "file_data": data_url(data)}
        content = [{"type": "file", "file": file}]
        raw = {"model": "r", "messages": [{"role": "user", "content": content}]}
        chat = parse_chat_request(json.dumps(raw).encode())
    return counts.bound(counts.chains["r"][0], chat), chat.input_tokens


@pytest.mark.parametrize("anthropic", [False, True], ids=["file_data", "document block"])
@pytest.mark.parametrize(("model", "kind"), list(PAGE_IMAGE))
def test_a_page_is_held_its_text_and_the_route_model_s_largest_image(
    model: str, kind: str, anthropic: bool
) -> None:
    found = cost(ONE_PAGE)
    assert found is not None and found.pages == 1
    assert largest(rules_for(model, kind)) == PAGE_IMAGE[model, kind]
    hold, parsed = held(route_counts(model, kind), ONE_PAGE, anthropic=anthropic)
    # The parse counted the page's text bound and GPT-4o's largest image; the hold replaces
    # that image by the route model's and keeps the rest of the request's count.
    rest = parsed - found.text_tokens - PARSE_PAGE_IMAGE_TOKENS
    assert hold == rest + found.text_tokens + PAGE_IMAGE[model, kind]


def test_an_unknown_model_s_page_is_held_every_rule_s_dearest_image() -> None:
    assert largest(ALL_RULES) == max(PAGE_IMAGE.values())
    unknown, _ = held(route_counts("llama-3.3-70b-vision", "openai"), ONE_PAGE)
    known, _ = held(route_counts("gpt-4o", "openai"), ONE_PAGE)
    assert unknown - known == largest(ALL_RULES) - 1_445


def test_a_chain_holds_a_page_at_its_dearest_target_s_image() -> None:
    alone, _ = held(route_counts("claude-sonnet-4-5", "anthropic"), ONE_PAGE)
    chain = route_counts("claude-sonnet-4-5", "anthropic", ("gpt-4.1-nano",))
    chained, _ = held(chain, ONE_PAGE)
    assert chained - alone == 3_779 - 1_640


def test_a_string_split_between_two_content_streams_counts() -> None:
    # A page's streams are one content: read one by one, the string's text sits in neither.
    text = prose(4000).encode()
    parts = [b"BT /F1 9 Tf 36 700 Td (" + text[:2000], text[2000:] + b") Tj ET"]
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents [4 0 R 5 0 R]"
    page += b" /Resources %s >>"
    data = build([*CATALOG, page % b"<< /Font << /F1 6 0 R >> >>", *map(stream, parts), FONT])
    found, billed = cost(data), billed_text(data)
    assert found is not None and billed > 500 and found.text_tokens >= billed


def test_a_font_whose_mapping_is_unknown_counts_its_bytes_at_its_expansion() -> None:
    font = b"<< /Type /Font /Subtype /Type0 /BaseFont /X /Encoding /Identity-H >>"
    drawn = b"\x00\x41" * 3000
    content = b"BT /F1 9 Tf 36 700 Td <" + drawn.hex().encode() + b"> Tj ET"
    found = cost(one_page(b"<< /Font << /F1 5 0 R >> >>", content, font))
    assert found is not None
    assert found.text_tokens >= len(drawn) * pdf.IDENTITY_FONT_EXPANSION


def test_content_past_the_parse_cap_counts_every_byte() -> None:
    filler = b"1 0 0 1 0 0 cm\n" * (pdf.MAX_PARSED_BYTES // 15 + 1)
    content = filler + b"BT /F1 9 Tf (x) Tj ET"
    found = cost(one_page(b"<< /Font << /F1 5 0 R >> >>", content, FONT))
    assert found is not None and found.text_tokens >= len(content) * pdf.SIMPLE_FONT_EXPANSION


def test_drawing_operators_count_nothing() -> None:
    shapes = b"0.5 0.5 0.5 rg 10 10 100 100 re f 10 10 m 200 200 l S\n" * 2000
    found = cost(one_page(b"<< /Font << /F1 5 0 R >> >>", shapes + b"BT /F1 9 Tf (hi) Tj ET", FONT))
    assert found is not None and 0 < found.text_tokens < 10


# Held / billed for the real-shaped documents (tests/pdf_samples.py corpus): the mock bills each
# page's pypdf text with cl100k_base and an image of the page by the model's rule, as its
# provider does; the gateway holds the page's text bound and the most one image costs with the
# model. Held at most 3 times that, never below (bench/budget/document_counts.py has the table).
MOST = 3.0
MODELS = {
    "claude-sonnet-4-5": "anthropic",
    "claude-opus-4-7": "anthropic",
    "gpt-4o": "openai",
    "gpt-4.1-nano": "openai",
}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", list(corpus()))
def test_real_shaped_documents_are_held_near_their_bill_and_never_below(
    name: str, model: str
) -> None:
    data = corpus()[name]
    found, pages = cost(data), pdf_pages(data)
    assert found is not None and pages is not None and found.pages == len(pages)
    text = sum(text_tokens(t) for t, _ in pages)
    if MODELS[model] == "anthropic":
        images = sum(page_image_tokens(size, image_limits(model)) for _, size in pages)
    else:
        images = sum(bill(billed_image_rules(model), size, None) for _, size in pages)
    hold = found.tokens(largest(rules_for(model, MODELS[model])))
    assert text + images <= hold <= MOST * (text + images)


# -- what is a PDF, and what cannot be read -------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "name"),
    [
        (data_url(b"not a pdf at all"), None),  # says application/pdf
        (data_url(b"not a pdf at all", "text/plain"), "report.PDF"),
        (data_url(b"%PDF-1.7\n1 0 obj <<", "application/octet-stream"), None),  # its header
        (data_url(written_pdf([b""], password="o", user_password="secret")), None),
    ],
    ids=["media type", "file name", "header", "password"],
)
def test_a_declared_pdf_that_cannot_be_read_is_a_400_naming_the_field(
    url: str, name: str | None
) -> None:
    pdf._cache.clear()
    with pytest.raises(InvalidRequest, match="cannot be read as a PDF") as caught:
        input_tokens(body((url, name)))
    assert caught.value.param == "messages[0].content[1].file.file_data"


def test_a_file_that_is_not_a_pdf_counts_its_bytes() -> None:
    text = prose(3000).encode()
    tokens = input_tokens(body((data_url(text, "text/plain"), "notes.txt")))
    assert len(text) <= tokens < len(text) + 100


def test_a_pdf_that_does_not_say_so_counts_the_larger_of_its_bytes_and_its_pages() -> None:
    data = compressed_text_pdf()[len(b"%PDF-1.7\n") :]  # no header, no name, another type
    pdf._cache.clear()
    tokens = input_tokens(body((data_url(data, "application/octet-stream"), None)))
    as_pdf = cost(data, declared=False)
    assert as_pdf is not None and tokens >= as_pdf.tokens() > 20 * len(data)


def test_a_pdf_that_does_not_say_so_is_held_at_least_its_bytes_on_any_model() -> None:
    # A scan: its bytes (a compressed image) are more than its pages' bound. Read as bytes it
    # counts them, so a model whose page image costs less than GPT-4o's (o3: 75 + 150 x 8)
    # holds it no lower; said to be a PDF, it is held its pages.
    data = scan()[len(b"%PDF-1.7\n") :]
    pdf._cache.clear()
    o3, gpt_4o = route_counts("o3", "openai"), route_counts("gpt-4o", "openai")
    undeclared = data_url(data, "application/octet-stream")
    as_bytes = parse_chat_request(json.dumps(body((undeclared, None))).encode())
    assert (hold := o3.bound(o3.chains["r"][0], as_bytes)) == as_bytes.input_tokens
    assert hold == gpt_4o.bound(gpt_4o.chains["r"][0], as_bytes) > len(data) * 3 // 4
    declared = parse_chat_request(json.dumps(body((data_url(data), None))).encode())
    saved = gpt_4o.bound(gpt_4o.chains["r"][0], declared) - o3.bound(o3.chains["r"][0], declared)
    assert saved == 3 * (1_445 - (75 + 150 * 8))


# -- caps: refused, never skipped -----------------------------------------------------------------


def test_a_decompression_bomb_is_refused() -> None:
    bomb = b"\0" * (MAX_DECODED_BYTES + 1)
    refused(one_page(b"<< >>", bomb), "decode to more than|limit of the PDF reader")


def test_a_hundred_thousand_pages_are_refused() -> None:
    n = 100_000
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(n))
    objects = [CATALOG[0], b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n)]
    objects += [b"<< /Type /Page /Parent 2 0 R >>"] * n
    refused(build(objects, packed=range(1, n + 3)), "more than")


def test_a_page_tree_thousands_deep_is_refused() -> None:
    depth = 5_000
    objects = [CATALOG[0]]
    objects += [b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % (i + 3) for i in range(depth)]
    objects.append(b"<< /Type /Page >>")
    refused(build(objects), "limit of the PDF reader")


def test_an_object_nested_a_hundred_thousand_deep_is_refused() -> None:
    deep = b"<< /Type /Page /Parent 2 0 R /Deep " + b"[" * 100_000 + b"]" * 100_000 + b" >>"
    refused(build([*CATALOG, deep]), "cannot be read as a PDF")


def test_forms_nested_deeper_than_the_cap_are_refused() -> None:
    objects = [*CATALOG, PAGE % b"<< /XObject << /X 5 0 R >> >>", stream(b"/X Do")]
    for i in range(20):
        inner = b"<< /XObject << /X %d 0 R >> >>" % (6 + i)
        extra = b" /Type /XObject /Subtype /Form /Resources " + inner
        objects.append(stream(b"/X Do", extra=extra))
    refused(build(objects), "nest forms")


def test_a_form_that_draws_itself_is_refused() -> None:
    extra = b" /Type /XObject /Subtype /Form /Resources << /XObject << /X 5 0 R >> >>"
    refused(
        one_page(b"<< /XObject << /X 5 0 R >> >>", b"/X Do", stream(b"/X Do", extra=extra)),
        "draws itself",
    )


def test_a_hundred_thousand_annotations_are_refused() -> None:
    n = 100_000
    refs = b" ".join(b"%d 0 R" % (4 + i) for i in range(n))
    objects = [*CATALOG, b"<< /Type /Page /Parent 2 0 R /Annots [%s] >>" % refs]
    objects += [b"<< /Type /Annot /Subtype /Text /Contents (hi) >>"] * n
    refused(build(objects, packed=range(1, n + 4)), "objects")


def test_one_page_listed_a_thousand_times_with_many_annotations_is_refused() -> None:
    n = 1_000
    refs = b" ".join(b"%d 0 R" % (4 + i) for i in range(n))
    kids = b" ".join([b"3 0 R"] * 1_000)
    objects = [CATALOG[0], b"<< /Type /Pages /Kids [%s] /Count 1000 >>" % kids]
    objects += [b"<< /Type /Page /Parent 2 0 R /Annots [%s] >>" % refs]
    objects += [b"<< /Type /Annot /Subtype /Text /Contents (hi) >>"] * n
    refused(build(objects, packed=range(1, n + 4)), "steps")


def test_the_caps_hold_for_a_request_and_a_cached_document_counts_the_same() -> None:
    big = pages_pdf([b""] * 600)
    request = body((data_url(big), None), (data_url(big + b"\n"), None))
    pdf._cache.clear()
    for _ in range(2):  # read, then every document already in the cache: the same answer
        with pytest.raises(InvalidRequest, match="more than 1000 pages") as caught:
            input_tokens(request)
        assert caught.value.param == "messages[0].content[2].file.file_data"


# -- the route's cap, the config, the import ------------------------------------------------------


def test_a_route_caps_the_pages_of_a_request() -> None:
    request = body((data_url(pages_pdf([b""] * 3)), None), (data_url(pages_pdf([b""] * 4)), None))
    check_pdf_pages(request, None)
    check_pdf_pages(request, 7)
    with pytest.raises(InvalidRequest, match="max_pdf_pages") as caught:
        check_pdf_pages(request, 6)
    assert caught.value.param == "messages[0].content[2].file.file_data"


def test_max_pdf_pages_is_optional_and_positive() -> None:
    assert RouteConfig(name="r", upstream="u").max_pdf_pages is None
    assert RouteConfig(name="r", upstream="u", max_pdf_pages=100).max_pdf_pages == 100
    with pytest.raises(pydantic.ValidationError):
        RouteConfig(name="r", upstream="u", max_pdf_pages=0)


def test_pypdf_is_imported_only_when_a_request_carries_a_pdf() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with_pdf = body((data_url(pages_pdf([b""])), None))
    code = (
        "import json, sys\n"
        "from hardcap_core.gateway import pipeline\n"
        "from hardcap_core.wire.openai_request import parse_chat_request\n"
        f"parse_chat_request({json.dumps(plain).encode()!r})\n"
        "before = 'pypdf' in sys.modules\n"
        f"parse_chat_request({json.dumps(with_pdf).encode()!r})\n"
        "print(json.dumps([before, 'pypdf' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, True]
