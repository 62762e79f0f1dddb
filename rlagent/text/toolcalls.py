"""Tool calls written in an assistant turn's text, in the Hermes / Qwen format or Llama 3.x's.

A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, with any text
around it; a turn may hold several (parallel calls). A turn without the tags whose whole
text is one JSON object is read as that call: Llama 3.x's native format
`{"name": ..., "parameters": {...}}` (its template's custom tool calls, optionally after
`<|python_tag|>`), or the Hermes object without its tags (small models often drop them);
a JSON object inside prose without tags is not. `parameters` is read as `arguments` (one
of them per call); they may be left out (no arguments). Used by every text environment with
JSON tool calls (`rlagent.text.toolworld`, `rlagent.text.bfcl`); each checks the names
and arguments against its own tools.
"""

from __future__ import annotations

import json
import re
from typing import Any
from typing import NamedTuple

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNBALANCED = "unbalanced <tool_call> tags (a call must be closed by </tool_call>)"
_PYTHON_TAG = "<|python_tag|>"  # Llama 3.x opens a tool call with it (optional).
_KEYS = ("name", "arguments", "parameters")


class ToolCall(NamedTuple):
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


class ParsedCalls(NamedTuple):
    """The calls of a turn's text (`parse_tool_calls`)."""

    calls: list[ToolCall]  # in the order written; empty: a turn without any call.
    error: str | None  # why the text is no well-formed call (None if it parses).


def parse_tool_calls(text: str) -> ParsedCalls:
    """The tool calls of an assistant turn's text, or why they do not parse (never raises).

    No tags and a text that does not start with `{` is a turn without calls (`calls`
    empty, `error` None); unbalanced tags, text that is not JSON (truncated, nested past
    Python's recursion limit, an integer of more than 4300 digits), not an object with a
    string `name` and an object `arguments`, or other keys are errors.
    """
    blocks = _TOOL_CALL.findall(text)
    if text.count("<tool_call>") != len(blocks) or text.count("</tool_call>") != len(blocks):
        return ParsedCalls([], _UNBALANCED)
    bare = text.strip().removeprefix(_PYTHON_TAG)
    if not blocks and not bare.strip().startswith("{"):
        return ParsedCalls([], None)
    calls = []
    for block in blocks or [bare]:
        try:
            call = json.loads(block)
        except (ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError.
            return ParsedCalls([], f"the tool call is not valid JSON ({str(error)[:80]})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedCalls([], 'the tool call must be a JSON object with a string "name"')
        if set(call) - set(_KEYS):
            return ParsedCalls([], f"unexpected keys {sorted(set(call) - set(_KEYS))}")
        if "arguments" in call and "parameters" in call:
            return ParsedCalls([], 'a call has "arguments" or "parameters", not both')
        arguments = call.get("arguments", call.get("parameters", {}))
        if not isinstance(arguments, dict):
            return ParsedCalls([], '"arguments" / "parameters" must be a JSON object')
        calls.append(ToolCall(call["name"], arguments))
    return ParsedCalls(calls, None)


def text_outside_calls(text: str) -> str:
    """The text of a turn around its `<tool_call>` blocks, stripped ('' for a turn that is
    one bare JSON call): an assistant message's content beside its `tool_calls`."""
    if "<tool_call>" not in text:
        return ""
    return _TOOL_CALL.sub("", text).strip()


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call (the inverse of `parse_tool_calls` for one call)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
