"""The layout shows the architecture, and the seams docs/architecture.md names hold: no import
circles; the shipped code never reaches the local tools; a package's ``__all__`` is exactly
what other code imports from it; each third-party library is imported and its errors translated
at its one boundary; wire formats live in ``wire/`` and providers in ``providers/``, each built
in one registry; a stream ends in one place; only the meter writes a meter's state, and only the
money owner (gateway/money.py) decides what an ended stream is charged. A module's length is no
seam: one concept stays in one module however long.

Imports inside functions count too: a lazy import that closes a circle is still a circle, and a
lazy import of a local tool still fails on Lambda, where ``local/`` is not shipped.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "hardcap_core"
LOCAL_ONLY = ("hardcap_core.local",)  # infra/Makefile DEV_ONLY; the CLI is local/cli.py


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in CORE.rglob("*.py")}


def imports(path: Path) -> Iterator[str]:
    """The hardcap_core modules ``path`` imports, anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the layout checks need absolute)"
            base = node.module or ""
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        yield from (n for n in names if n in MODULES)


GRAPH = {name: set(imports(path)) - {name} for name, path in MODULES.items()}


def cycle_from(start: str) -> list[str] | None:
    """An import path from ``start`` back to itself, if there is one."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in GRAPH[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_there_are_no_import_circles() -> None:
    circles = [c for name in sorted(GRAPH) if (c := cycle_from(name))]
    assert circles == []


def test_shipped_modules_never_import_local_tools() -> None:
    def local(name: str) -> bool:
        return any(name == p or name.startswith(f"{p}.") for p in LOCAL_ONLY)

    offenders = {
        (name, target)
        for name, targets in GRAPH.items()
        if not local(name)
        for target in targets
        if local(target)
    }
    assert offenders == set()


def test_the_package_top_is_small_and_the_seams_are_subpackages() -> None:
    top = [p.name for p in CORE.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 12, sorted(top)
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    assert {"config", "ledger", "gateway", "wire", "providers", "local"} <= packages


# Where a package's names are imported from: the package itself, and the code around it.
IMPORTERS = [CORE, *(CORE.parent / d for d in ("tests", "bench", "functions"))]


def names_imported_from_packages() -> dict[str, set[str]]:
    """Per hardcap_core package, the names others import from its ``__init__`` (not its
    submodules), anywhere in the repository's Python."""
    packages = {module_name(p) for p in CORE.rglob("__init__.py")}
    found: dict[str, set[str]] = {p: set() for p in packages}
    for folder in IMPORTERS:
        for path in folder.rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in packages:
                    found[node.module] |= {
                        a.name for a in node.names if f"{node.module}.{a.name}" not in MODULES
                    }
    return found


def test_each_packages_all_is_exactly_what_others_import_from_it() -> None:
    for package, imported in sorted(names_imported_from_packages().items()):
        tree = ast.parse(MODULES[package].read_text())
        listed = [
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and any(root_name(t) == "__all__" for t in n.targets)
        ]
        # One __all__ where others import names, none where they import only submodules.
        assert [set(a) for a in listed] == ([imported] if imported else []), package


def is_local(name: str) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in LOCAL_ONLY)


SHIPPED = {name: ast.parse(p.read_text()) for name, p in MODULES.items() if not is_local(name)}


def short(name: str) -> str:
    return name.removeprefix("hardcap_core.")


# -- each library at its boundary ---------------------------------------------------------------

# A library: the modules that may import it, those that may catch its errors (to retry or to
# reconnect), and those that translate them into the gateway's own (docs/architecture.md,
# "Packages": "... errors are translated here").
BOUNDARIES: dict[str, tuple[set[str], set[str], set[str]]] = {
    "redis": (
        {"ledger.connection", "ledger.pipe", "ledger.iam_auth"},
        {"ledger.connection", "ledger.pipe"},
        {"ledger.connection"},
    ),
    "aiohttp": (
        {"providers.aiohttp_transport"},
        {"providers.aiohttp_transport"},
        {"providers.aiohttp_transport"},
    ),
    # EventBridge's errors are caught and answered as notices not delivered (sent next pass).
    "botocore": (
        {"control.store", "rollup.table", "rollup.eventbridge"}
        | {"providers.bedrock", "providers.bedrock_errors"},
        {"control.store", "rollup.table", "rollup.eventbridge"},
        {"control.store", "rollup.table"},
    ),
    "jwt": ({"identity.verifier"}, {"identity.verifier"}, {"identity.verifier"}),
}


def library_names(tree: ast.AST) -> dict[str, str]:
    """The names a module binds to a watched library's objects, each to its library."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = node.module.split(".")[0]
    return {name: lib for name, lib in out.items() if lib in BOUNDARIES}


def root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def handlers(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[str, bool]]:
    """Per ``except`` of a watched library's error: the library, and whether the handler
    translates it (raises an exception built from a name not the library's)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        libs = {names[n] for t in caught if (n := root_name(t)) in names}
        raised = {
            root_name(r.exc.func)
            for r in ast.walk(node)
            if isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call)
        }
        for lib in libs:
            yield lib, any(n is not None and names.get(n) != lib for n in raised)


def test_each_library_is_imported_and_its_errors_translated_at_its_boundary() -> None:
    imported: dict[str, set[str]] = {lib: set() for lib in BOUNDARIES}
    caught: dict[str, set[str]] = {lib: set() for lib in BOUNDARIES}
    translated: dict[str, set[str]] = {lib: set() for lib in BOUNDARIES}
    for name, tree in SHIPPED.items():
        names = library_names(tree)
        for lib in set(names.values()):
            imported[lib].add(short(name))
        for lib, translates in handlers(tree, names):
            caught[lib].add(short(name))
            if translates:
                translated[lib].add(short(name))
    for lib, (may_import, may_catch, translate) in BOUNDARIES.items():
        assert imported[lib] <= may_import, (lib, imported[lib] - may_import)
        assert caught[lib] <= may_catch, (lib, caught[lib] - may_catch)
        assert translated[lib] == translate, (lib, translated[lib])


def test_the_boundary_check_sees_a_translation_and_a_retry() -> None:
    tree = ast.parse(
        "from redis.exceptions import TimeoutError as T\n"
        "try:\n    f()\nexcept T as e:\n    raise LedgerUnavailable('x') from e\n"
        "try:\n    f()\nexcept (T, OSError):\n    raise\n"
    )
    assert list(handlers(tree, library_names(tree))) == [("redis", True), ("redis", False)]


# -- the two seams: wire formats and providers --------------------------------------------------


def classes_with(*methods: str) -> Iterator[tuple[str, ast.ClassDef]]:
    """The concrete classes (not protocols) defining all of ``methods``, with their module."""
    for name, tree in SHIPPED.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            if any(root_name(b) == "Protocol" for b in node.bases):
                continue
            defined = {
                f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if set(methods) <= defined:
                yield short(name), node


def names_in(module: str) -> set[str]:
    return {n.id for n in ast.walk(SHIPPED[module]) if isinstance(n, ast.Name)}


def test_wire_formats_live_in_wire_and_are_built_in_one_place() -> None:
    formats = list(classes_with("parse", "encoder", "reply"))
    encoders = list(classes_with("event", "close", "error"))
    assert {c.name for _, c in formats} >= {"OpenAIChat", "AnthropicMessages"}
    assert [m for m, _ in formats + encoders if not m.startswith("wire.")] == []
    built = names_in("hardcap_core.gateway.app")
    assert [c.name for _, c in formats if c.name not in built] == []


def test_providers_live_in_providers_and_are_built_in_the_registry() -> None:
    def has_dialect(c: ast.ClassDef) -> bool:
        return any(
            isinstance(s, ast.Assign) and any(root_name(t) == "dialect" for t in s.targets)
            for s in c.body
        )

    found = [(m, c) for m, c in classes_with("complete", "stream") if has_dialect(c)]
    assert {c.name for _, c in found} == {
        "OpenAICompatible",
        "AnthropicMessages",
        "BedrockConverse",
    }
    assert [m for m, _ in found if not m.startswith("providers.")] == []
    built = names_in("hardcap_core.providers.registry")
    assert [c.name for _, c in found if c.name not in built] == []


# -- one owner of a stream's end ----------------------------------------------------------------


def calls_in_functions(match: Callable[[ast.Call], bool]) -> set[tuple[str, str]]:
    """(module, function) of every call ``match`` accepts in the shipped code."""
    out: set[tuple[str, str]] = set()
    for name, tree in SHIPPED.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and match(node):
                        out.add((short(name), fn.name))
    return out


def names_a_meter(expr: ast.expr) -> bool:
    """``meter``, ``self.meter``, ``admission.meter``: an expression naming a request's meter."""
    return (isinstance(expr, ast.Name) and expr.id == "meter") or (
        isinstance(expr, ast.Attribute) and expr.attr == "meter"
    )


def method_call(method: str, on: Callable[[ast.expr], bool]) -> Callable[[ast.Call], bool]:
    def match(call: ast.Call) -> bool:
        f = call.func
        return isinstance(f, ast.Attribute) and f.attr == method and on(f.value)

    return match


def test_a_stream_ends_in_one_place() -> None:
    def anything(_: ast.expr) -> bool:
        return True

    # Relay.end settles a stream; the non-streamed path settles once by how the call ended.
    assert calls_in_functions(method_call("settle", names_a_meter)) == {
        ("gateway.relay", "end"),
        ("gateway.pipeline", "_complete"),
    }
    assert calls_in_functions(method_call("_close_upstream", anything)) == {
        ("gateway.relay", "end")
    }

    def closes_an_encoder(call: ast.Call) -> bool:
        return any(k.arg == "for_length" for k in call.keywords)

    assert calls_in_functions(closes_an_encoder) == {("gateway.relay", "end")}


# -- the meter's state, and who decides a charge ------------------------------------------------

METER = "hardcap_core.gateway.meter"


def meter_writes(tree: ast.AST) -> Iterator[str]:
    """Each attribute of a meter that ``tree`` assigns (``meter.x = ``, ``a.meter.x += ``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets: Iterable[ast.expr] = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(leaf, ast.Attribute) and names_a_meter(leaf.value):
                    yield leaf.attr


def test_only_the_meter_writes_a_meters_state() -> None:
    # Others say what happened through its methods (asked_for, serve_with, billed_elsewhere,
    # note_read, received_whole), so its fields change only by its own rules.
    writes = {
        (short(name), attr)
        for name, tree in SHIPPED.items()
        if name != METER
        for attr in meter_writes(tree)
    }
    assert writes == set()
    sample = ast.parse("admission.meter.asked = 3\nmeter.unseen, x = u, 1\nself.meter.seen += 1")
    assert list(meter_writes(sample)) == ["asked", "unseen", "seen"]


def test_only_the_hold_policies_decide_what_an_ended_stream_is_charged() -> None:
    def charge_rule(call: ast.Call) -> bool:
        f = call.func
        rules = ("estimated_output", "unseen_billed", "settle_charge")
        return (isinstance(f, ast.Name) and f.id in rules) or (
            isinstance(f, ast.Attribute) and f.attr in ("least_billed", "unseen_billed")
        )

    assert {m for m, _ in calls_in_functions(charge_rule)} == {"gateway.money"}
    # The meter asks its policy object; it never branches on whether it holds a reservation.
    tests = [
        n.test for n in ast.walk(SHIPPED[METER]) if isinstance(n, ast.If | ast.IfExp | ast.While)
    ]
    held = [
        ast.unparse(t)
        for t in tests
        for n in ast.walk(t)
        if isinstance(n, ast.Attribute) and n.attr in ("reservation", "truncate", "extend")
    ]
    assert held == []
