"""The bounded field checks every edge message is built from, and the MessageError they raise.

Each check takes a parsed JSON value (or an object and its key), bounds it (type, length, count, range,
nesting; numbers finite, bools never numbers) and returns it, or raises MessageError naming the field.
Its own module so that edge/messages.py holds the message schemas, topics and wire encoding, and this one
the plain-Python validation they rely on; it imports nothing of messages.py (which imports it).
"""
from __future__ import annotations

import math
import re
from typing import Union

from gt_serve.errors import InvalidArgument

MAX_NAME_CHARS = 64
MAX_TEXT_CHARS = 256
MAX_MAP_ITEMS = 1024
MAX_EXTRA_DEPTH = 4
MAX_INT = 2**63 - 1
MAX_FLOAT = 1e18
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class MessageError(InvalidArgument):
    """A peer message that cannot be accepted (malformed, oversized, out of range)."""


JsonValue = Union[None, bool, int, float, str, list, dict]


_MISSING = object()


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text[:32]}")
    return value


def no_constant(text: str) -> float:
    raise ValueError(f"non-finite constant {text}")


def obj_field(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise MessageError(f"{where} must be a JSON object")
    return value


def name_field(value: object, where: str) -> str:
    if not isinstance(value, str) or not _NAME_PATTERN.fullmatch(value):
        raise MessageError(f"{where} must match {_NAME_PATTERN.pattern}")
    return value


def text_field(value: object, where: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise MessageError(f"{where} must be a non-empty string of at most {max_chars} chars")
    return value


def endpoint_field(value: object, where: str) -> str:
    text = text_field(value, where, MAX_TEXT_CHARS)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise MessageError(f"{where} must be 'host:port'")
    return text


def _present(obj: dict, key: str, where: str, default: object) -> object:
    value = obj.get(key, default)
    if value is _MISSING:
        raise MessageError(f"{where}.{key} is required")
    return value


def int_field(obj: dict, key: str, where: str, default: object = _MISSING) -> int:
    value = _present(obj, key, where, default)
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise MessageError(f"{where}.{key} must be an integer within [0, 2**63)")
    return value


def num_field(obj: dict, key: str, where: str, default: object = _MISSING) -> float:
    value = _present(obj, key, where, default)
    if type(value) not in (int, float) or not 0 <= value <= MAX_FLOAT:
        raise MessageError(f"{where}.{key} must be a finite number within [0, 1e18]")
    return float(value)


def list_field(obj: dict, key: str, where: str, max_items: int) -> list:
    value = obj.get(key, [])
    if not isinstance(value, list) or len(value) > max_items:
        raise MessageError(f"{where}.{key} must be a list of at most {max_items} items")
    return value


def num_map_field(obj: dict, key: str, where: str) -> dict[str, float]:
    value = obj_field(obj.get(key, {}), f"{where}.{key}")
    if len(value) > MAX_MAP_ITEMS:
        raise MessageError(f"{where}.{key} has more than {MAX_MAP_ITEMS} entries")
    return {text_field(k, f"{where}.{key} key", MAX_NAME_CHARS * 2): num_field(value, k, f"{where}.{key}")
            for k in value}


def extra_field(value: object, where: str, depth: int) -> JsonValue:
    """A bounded free-form JSON value (device extras, power profile)."""
    if depth > MAX_EXTRA_DEPTH:
        raise MessageError(f"{where} is nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if abs(value) > MAX_FLOAT:
            raise MessageError(f"{where} is out of range")
        return value
    if isinstance(value, str):
        return text_field(value, where, MAX_TEXT_CHARS) if value else value
    if isinstance(value, list):
        if len(value) > MAX_MAP_ITEMS:
            raise MessageError(f"{where} has too many items")
        return [extra_field(x, f"{where}[]", depth + 1) for x in value]
    if isinstance(value, dict):
        if len(value) > MAX_MAP_ITEMS:
            raise MessageError(f"{where} has too many entries")
        return {text_field(k, f"{where} key", MAX_NAME_CHARS): extra_field(v, f"{where}.{k}", depth + 1)
                for k, v in value.items()}
    raise MessageError(f"{where} has an unsupported JSON type")
