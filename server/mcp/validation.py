"""Tool-argument validation against the spec's input schemas (jsonschema, Draft 2020-12).

Validation happens here, before the engine is called, so that a malformed call is a permanent tool error
and never reaches storage. Two spec errors are raised instead of a generic argument error, so that they
are the ones a client sees whatever layer notices first:

- an empty ``items`` array on ``append_memory`` is ``EmptyBatch`` (the schema's ``minItems: 1``);
- a ``conversation_id`` that is not a string is ``InvalidConversationId`` (reason decided by the engine's
  own validator, ``logstore.core.ids.validate_conversation_id``).

Messages name the argument and the rule, never echo the offending value (it may be megabytes).

What an item may hold (nesting depth, finite numbers, integer size, valid strings) is not checked here: the
schema says only "object", and the engine's payload rules (``logstore/batch.py``), which every append
reaches through ``Store.append``, are the one home of that rule for the server and the Python API alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from logstore.core import errors
from logstore.core.ids import validate_conversation_id
from logstore.core.limits import MAX_BATCH_ITEMS

from .spec_tools import ToolDef

__all__ = ["ArgumentValidator"]

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "object": "a JSON object",
    "array": "an array",
    "null": "null",
    "boolean": "a boolean",
    "number": "a number",
}


def _path(error: ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _expected(value: object) -> str:
    names = value if isinstance(value, list) else [value]
    return " or ".join(_TYPE_NAMES.get(str(n), str(n)) for n in names)


def _message(error: ValidationError) -> str:
    path, rule, bound = _path(error), error.validator, error.validator_value
    if rule == "required":
        # error.message is "'name' is a required property": name comes from the schema, not the client.
        missing = [name for name in bound if name not in (error.instance or {})]
        return f"missing required argument '{missing[0] if missing else bound[0]}'"
    if rule == "type":
        return f"argument '{path}' must be {_expected(bound)}"
    if rule == "maximum":
        return f"argument '{path}' must be at most {bound}"
    if rule == "minimum":
        return f"argument '{path}' must be at least {bound}"
    if rule == "maxItems":
        return f"argument '{path}' may hold at most {bound} entries"
    if rule == "minItems":
        return f"argument '{path}' must hold at least {bound} entries"
    return f"argument '{path or 'arguments'}' does not satisfy the input schema ({rule})"


class ArgumentValidator:
    """Validates and normalises one tool's arguments; built once per tool."""

    def __init__(self, tool: ToolDef) -> None:
        Draft202012Validator.check_schema(tool.input_schema)
        self.tool = tool
        self._validator = Draft202012Validator(tool.input_schema)
        props: Mapping[str, Any] = tool.input_schema.get("properties", {})
        self._defaults = {name: spec["default"] for name, spec in props.items() if "default" in spec}
        self._integers = tuple(name for name, spec in props.items() if spec.get("type") == "integer")
        self._max_items = {name: spec["maxItems"] for name, spec in props.items() if "maxItems" in spec}

    def __call__(self, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Return the arguments with schema defaults applied, or raise a ``LogstoreError``."""
        args = dict(arguments or {})
        for name, bound in self._max_items.items():
            # Checked before jsonschema, which would first type-check every entry: an 8 MiB body of `{}`s
            # is millions of entries, and validation runs on the event loop.
            value = args.get(name)
            if isinstance(value, list) and len(value) > bound:
                raise errors.InvalidArgument(
                    f"argument '{name}' may hold at most {bound} entries", field=name
                )
        # Only the first error is reported: iterating all of them costs O(items) for a bad batch.
        error = next(iter(self._validator.iter_errors(args)), None)
        if error is not None:
            raise self._to_logstore_error(error, args)
        for name, default in self._defaults.items():
            args.setdefault(name, default)
        for name in self._integers:
            # JSON Schema counts 5.0 as an integer; the engine wants a real int.
            if isinstance(args.get(name), float):
                args[name] = int(args[name])
        return args

    def _to_logstore_error(self, error: ValidationError, args: dict[str, Any]) -> errors.LogstoreError:
        path = list(error.absolute_path)
        if path == ["conversation_id"] and error.validator == "type":
            try:
                validate_conversation_id(args["conversation_id"])
            except errors.InvalidConversationId as exc:
                return exc
        if path == ["items"] and error.validator == "minItems" and self.tool.name == "append_memory":
            return errors.EmptyBatch(
                f"items must not be empty: an append batch holds 1 to {MAX_BATCH_ITEMS} items"
            )
        field = str(path[0]) if path else None
        if error.validator == "required":
            field = next((n for n in error.validator_value if n not in args), None)
        return errors.InvalidArgument(_message(error), field=field)
