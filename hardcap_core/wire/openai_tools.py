"""What OpenAI bills for function tools, tool calls and tool results, counted as it renders them.

OpenAI does not send a tool's JSON to the model. It renders the functions into a TypeScript-like
namespace in the system prompt::

    namespace functions {

    // Get the current weather in a given location
    type get_current_weather = (_: {
    // The city and state, e.g. San Francisco, CA
    location: string,
    unit?: "celsius" | "fahrenheit",
    }) => any;

    } // namespace functions

so a definition is billed about two thirds of its JSON's tokens: no quotes, braces or
``"type": "function"`` wrapper. Two rules are documented by OpenAI's cookbook ("How to count
tokens with tiktoken", ``num_tokens_for_tools``): per function 7 tokens (10 on gpt-4 and
gpt-3.5) plus ``name:description``, per property 3 plus ``key:type:description``, per enum value
3 plus its text, 3 when a function has properties and 12 for the whole block; it gives the API's
own count on its example (101 for gpt-4o, 105 for gpt-4). It says nothing of nested objects,
arrays, ``anyOf``, defaults or other schema keywords: for those the bill is not documented, and
the count here is the larger of the cookbook's rule (applied at every depth) and the tokens of
the rendering above (every nested property, every keyword rendered as a comment), plus the
cookbook's frame. Never below either rendering, and within a few per cent of both on the
documented examples (tests/unit/test_tool_counts.py, docs/design.md "Tools").

A tool call in an assistant message is billed as its function's name and its arguments (the
model wrote ``functions.name`` and the argument text, not a JSON object around an escaped
string); its id counts too, since whether it is rendered is not documented. A tool result is a
message like any other: its content, and the id it answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

TextCount = Callable[[str], int]

# The cookbook's constants (num_tokens_for_tools). FUNC_INIT is gpt-4 / gpt-3.5's 10, the larger
# of the two it lists (7 on gpt-4o): the count does not know which model the route names.
FUNC_INIT = 10
PROP_INIT = 3
PROP_KEY = 3
ENUM_INIT = -3
ENUM_ITEM = 3
FUNC_END = 12
# A rendered namespace: its own lines are in the text; it is joined to the system prompt (or
# is one of its own: 3 tokens as a message) with a separator, 1.
RENDER_FRAME = 3 + 1
# A tool call, beyond its name and arguments: 3 as a message of its own (each of parallel calls
# may be one), 3 for its recipient (``to=functions.``), 2 for the arguments' content type
# (``json``) and the end of the call.
CALL_FRAME = 8

_SCALARS = {"string", "number", "integer", "boolean", "null"}
# Keywords the rendering draws as part of the type, not as a comment.
_STRUCTURAL = frozenset(
    {"type", "properties", "required", "items", "enum", "anyOf", "oneOf", "allOf", "description",
     "const", "additionalProperties", "title", "$schema", "strict"}
)  # fmt: skip


def tool_definition_tokens(tools: list[Any], count: TextCount) -> int:
    """The prompt tokens a list of chat ``tools`` (or legacy ``functions``) is billed: the larger
    of the cookbook's rule and the namespace rendering (see the module's docstring)."""
    functions = [_function_of(tool) for tool in tools]
    if not functions:
        return 0
    cookbook = FUNC_END + sum(_cookbook_function(f, count) for f in functions)
    rendered = RENDER_FRAME + count(render_functions(functions))
    return max(cookbook, rendered)


def tool_call_tokens(calls: Any, count: TextCount) -> int:
    """An assistant message's ``tool_calls`` (or its legacy ``function_call``, one call): each
    call's frame, id, name and argument text; any other field by its text."""
    total = 0
    for call in calls if isinstance(calls, list) else [calls]:
        if not isinstance(call, dict):
            total += _text(call, count)
            continue
        function = call.get("function") if "function" in call else call
        total += CALL_FRAME
        for field, value in call.items():
            if field not in ("type", "function", "name", "arguments"):
                total += _text(value, count)  # the id, and fields not known
        if isinstance(function, dict):
            total += sum(_text(value, count) for value in function.values())
        else:
            total += _text(function, count)
        if function is not call:
            total += sum(_text(call.get(k), count) for k in ("name", "arguments"))
    return total


def render_functions(functions: list[dict[str, Any]]) -> str:
    """The namespace OpenAI renders ``functions`` (each a chat tool's ``function``) into."""
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for function in functions:
        description = function.get("description")
        if description is not None:
            lines.extend(_comment(description))
        name = _plain(function.get("name"))
        parameters = function.get("parameters")
        extra = {
            k: v for k, v in function.items() if k not in ("name", "description", "parameters")
        }
        lines.extend(_comment(_json(extra)) if extra else ())
        if isinstance(parameters, dict) and parameters.get("properties"):
            lines.append(f"type {name} = (_: {_type(parameters, 0)}) => any;")
        elif parameters is None or parameters == {"type": "object", "properties": {}}:
            lines.append(f"type {name} = () => any;")
        else:
            lines.append(f"type {name} = (_: {_type(parameters, 0)}) => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _function_of(tool: Any) -> dict[str, Any]:
    """A chat tool's ``function`` object, or a legacy function itself; anything else as a
    function whose only content is its JSON (so it still counts)."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
        function: dict[str, Any] = tool["function"]
        rest = {k: v for k, v in tool.items() if k not in ("type", "function")}
        return {**function, **({"x_tool": rest} if rest else {})}
    if isinstance(tool, dict) and "name" in tool:
        return tool
    return {"name": "", "description": _json(tool)}


def _type(schema: Any, depth: int) -> str:
    """A JSON Schema as the TypeScript type the rendering draws (an object over lines)."""
    if not isinstance(schema, dict):
        return _json(schema)
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(_json(v) for v in schema["enum"]) or "never"
    if "const" in schema:
        return _json(schema["const"])
    for union in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(union), list):
            joiner = " & " if union == "allOf" else " | "
            return joiner.join(_type(s, depth) for s in schema[union]) or "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_type({**schema, "type": k}, depth) for k in kind) or "any"
    if kind == "array":
        items = schema.get("items")
        return f"{_type(items, depth)}[]" if items is not None else "any[]"
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            extra = schema.get("additionalProperties")
            return f"Record<string, {_type(extra, depth)}>" if isinstance(extra, dict) else "object"
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        lines = ["{"]
        for key, value in properties.items():
            lines.extend(_property_comments(value))
            mark = "" if key in required else "?"
            lines.append(f"{_plain(key)}{mark}: {_type(value, depth + 1)},")
        lines.append("}")
        return "\n".join(lines)
    if isinstance(kind, str):
        return "number" if kind == "integer" else kind
    return "any"


def _property_comments(schema: Any) -> list[str]:
    """A property's description and every keyword the type does not draw, as comments."""
    if not isinstance(schema, dict):
        return []
    lines: list[str] = []
    for key in ("title", "description"):
        if schema.get(key) is not None:
            lines.extend(_comment(schema[key]))
    for key, value in schema.items():
        if key not in _STRUCTURAL:
            lines.append(f"// {_plain(key)}: {_json(value)}")
    return lines


def _comment(value: Any) -> list[str]:
    return [f"// {line}" for line in _plain(value).split("\n")]


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _text(value: Any, count: TextCount) -> int:
    if value is None:
        return 0
    return count(value if isinstance(value, str) else _json(value))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _cookbook_function(function: dict[str, Any], count: TextCount) -> int:
    """The cookbook's rule for one function, applied to nested properties too (it shows one
    level; deeper ones are at least as costly as a property of the first)."""
    name = _plain(function.get("name", ""))
    description = _plain(function.get("description", "")).removesuffix(".")
    extra = {k: v for k, v in function.items() if k not in ("name", "description", "parameters")}
    total = FUNC_INIT + count(f"{name}:{description}") + (count(_json(extra)) if extra else 0)
    parameters = function.get("parameters")
    return total + _cookbook_properties(parameters, count)


def _cookbook_properties(schema: Any, count: TextCount) -> int:
    if not isinstance(schema, dict):
        return count(_json(schema)) if schema is not None else 0
    properties = schema.get("properties")
    total = 0
    if isinstance(properties, dict) and properties:
        total += PROP_INIT
        for key, value in properties.items():
            total += PROP_KEY + _cookbook_property(_plain(key), value, count)
    items = schema.get("items")
    if items is not None:
        total += _cookbook_properties(items, count)
    for union in ("anyOf", "oneOf", "allOf"):
        options = schema.get(union)
        if isinstance(options, list):
            total += sum(_cookbook_properties(option, count) for option in options)
    return total


def _cookbook_property(key: str, schema: Any, count: TextCount) -> int:
    if not isinstance(schema, dict):
        return count(f"{key}:{_json(schema)}")
    total = 0
    enum = schema.get("enum")
    if isinstance(enum, list):
        total += ENUM_INIT + sum(ENUM_ITEM + count(_plain(item)) for item in enum)
    kind = schema.get("type", "")
    description = _plain(schema.get("description", "")).removesuffix(".")
    total += count(f"{key}:{_plain(kind)}:{description}")
    others = {k: v for k, v in schema.items() if k not in _STRUCTURAL}
    total += count(_json(others)) if others else 0
    return total + _cookbook_properties(schema, count)
