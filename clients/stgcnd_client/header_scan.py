"""A header's limits as a msgspec type, and its id found in a header that does not decode.

`bounded_type` declares every limit of docs/protocol.md §2 so that msgspec checks them in C
while it decodes (a hostile header costs what decoding it does, never a Python step per
value). msgspec has no way to read a map one entry at a time; `read_id` does that, in
Python, for the reply's id (§4 "The echoed id"). Pure, and it imports nothing of the
package, so the codec (protocol.py) sits on top of it.
"""

# msgspec evaluates the bounded type at run time: on Python 3.8 it must be written with
# Union, List and Dict.
from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Union

import msgspec
from msgspec import Meta

if sys.version_info >= (3, 9):
    from typing import Annotated  # novermin (3.8 takes it below)
else:  # pragma: no cover - Python 3.8
    from typing_extensions import Annotated

# msgpack-c and msgpack-python stop at this many nested containers; so does `read_id` when
# it skips a value (the documented nesting limit of a header, `max_depth`, is lower).
MAX_DEPTH = 1024


class ScanError(ValueError):
    """The bytes are not one msgpack value within the limits (the message says which)."""


@dataclass(frozen=True)
class Bounds:
    str_len: int      # characters of any str (a key too); `read_id` reads keys of as many bytes
    bin_len: int
    array_len: int
    map_len: int
    depth: int = MAX_DEPTH  # containers nested, the header's own map the first


def bounded_type(bounds: Bounds) -> Any:
    """The msgspec type of a header within `bounds`: a map of string keys, strings of at most
    str_len characters, lists and maps within their lengths, nested at most `depth` deep, no
    bin and no ext. Decoding to it checks every limit in C. Each level doubles the type
    msgspec builds (a list's and a map's values are each the level below): 8 costs ~5 ms once."""
    string = Annotated[str, Meta(max_length=bounds.str_len)]
    value: Any = Union[None, bool, int, float, string]
    for _ in range(bounds.depth - 1):
        value = Union[None, bool, int, float, string,
                      Annotated[List[value], Meta(max_length=bounds.array_len)],
                      Annotated[Dict[string, value], Meta(max_length=bounds.map_len)]]
    return Annotated[Dict[string, value], Meta(max_length=bounds.map_len)]


def problem(error: msgspec.ValidationError, bounds: Bounds) -> str:
    """What the bounded type's refusal means, in the words of docs/protocol.md §2."""
    message = str(error)
    text, _, where = message.partition(" - at ")
    where = f" (at {where})" if where else ""
    for kind, what in (("array", "a list of more than {} items"),
                       ("object", "a map of more than {} entries"),
                       ("str", "a string of more than {} characters")):
        prefix = f"Expected `{kind}` of length <= "
        if text.startswith(prefix):
            return what.format(text[len(prefix):]) + where
    if ", got `array`" in text or ", got `object`" in text:
        return f"containers nested more than {bounds.depth} deep{where}"
    if ", got `bytes`" in text or ", got `ext`" in text:
        return f"a bin or ext value; headers carry none{where}"
    return message


_UNPACK = {1: struct.Struct(">B").unpack_from, 2: struct.Struct(">H").unpack_from,
           4: struct.Struct(">I").unpack_from, 8: struct.Struct(">Q").unpack_from}
_SIGNED = {1: struct.Struct(">b").unpack_from, 2: struct.Struct(">h").unpack_from,
           4: struct.Struct(">i").unpack_from, 8: struct.Struct(">q").unpack_from}
# Fixed-size scalars: marker -> bytes after it (nil, bools, floats, ints).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_STR = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_BIN = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_ARRAY = {0xDC: 2, 0xDD: 4}
_MAP = {0xDE: 2, 0xDF: 4}


class _Reader:
    """A cursor over one header. `checked` reads apply every bound and decode strings (what a
    decoder building the value does); unchecked ones only follow the structure (a skip)."""

    def __init__(self, data: bytes, bounds: Bounds) -> None:
        self.data = data
        self.pos = 0
        self.bounds = bounds

    def _take(self, n: int) -> int:
        """The position of the next n bytes, consumed."""
        start = self.pos
        if start + n > len(self.data):
            raise ScanError("the header is cut short")
        self.pos = start + n
        return start

    def _length(self, size: int) -> int:
        return int(_UNPACK[size](self.data, self._take(size))[0])

    def container(self, checked: bool) -> tuple[bool, int] | None:
        """(is a map, entries) when a container starts here (consumed), else None."""
        b = self.data[self.pos] if self.pos < len(self.data) else -1
        if 0x80 <= b <= 0x9F:
            self.pos += 1
            is_map, n = b < 0x90, b & 0x0F
        elif b in _MAP or b in _ARRAY:
            self.pos += 1
            is_map = b in _MAP
            n = self._length(_MAP[b] if is_map else _ARRAY[b])
        else:
            return None
        bound = self.bounds.map_len if is_map else self.bounds.array_len
        if checked and n > bound:
            raise ScanError(f"a {'map' if is_map else 'list'} of {n} entries; the limit is "
                            f"{bound}")
        return is_map, n

    def scalar(self, checked: bool) -> object:
        """One non-container value: a str (when checked), an int, or _OTHER for the rest."""
        data = self.data
        if self.pos >= len(data):
            raise ScanError("the header is cut short")
        b = data[self.pos]
        self.pos += 1
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0xA0 <= b <= 0xBF:
            return self._str(b & 0x1F, checked)
        if b in _FIXED:
            size = _FIXED[b]
            at = self._take(size)
            if 0xCC <= b <= 0xCF:
                return int(_UNPACK[size](data, at)[0])
            if 0xD0 <= b <= 0xD3:
                return int(_SIGNED[size](data, at)[0])
            return _OTHER
        if b in _STR:
            return self._str(self._length(_STR[b]), checked)
        if b in _BIN:
            n = self._length(_BIN[b])
            if checked and n > self.bounds.bin_len:
                raise ScanError(f"a bin value of {n} bytes; headers carry no binary data")
            self._take(n)
            return _BIN_VALUE
        if b in _EXT or b in _FIXEXT:
            n = self._length(_EXT[b]) if b in _EXT else _FIXEXT[b]
            if checked and n > 0:  # extension types (timestamps too) have no place here
                raise ScanError("an ext value; headers carry none")
            self._take(1 + n)
            return _OTHER
        raise ScanError(f"byte 0x{b:02x} at {self.pos - 1} starts no msgpack value")

    def _str(self, n: int, checked: bool) -> object:
        if checked and n > self.bounds.str_len:
            raise ScanError(f"a string of {n} bytes; the limit is {self.bounds.str_len}")
        at = self._take(n)
        if not checked:
            return _OTHER
        try:
            return bytes(self.data[at:at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ScanError("a string that is not UTF-8") from None

    def value(self, checked: bool) -> object:
        """Consume one value, containers whole; its scalar when it is one, else _OTHER."""
        found = self.container(checked)
        if found is None:
            return self.scalar(checked)
        pending = [found[1] * (2 if found[0] else 1)]  # values left at each open level
        while pending:
            if pending[-1] == 0:
                pending.pop()
                continue
            pending[-1] -= 1
            inner = self.container(checked)
            if inner is None:
                self.scalar(checked)
                continue
            if len(pending) + 1 > MAX_DEPTH:
                raise ScanError(f"containers nested more than {MAX_DEPTH} deep")
            pending.append(inner[1] * (2 if inner[0] else 1))
        return _OTHER


_OTHER = object()      # a value that is neither str nor int (nil, bool, float, ext, skipped)
_BIN_VALUE = object()  # a bin value (within bounds only when empty)


def read_id(header: bytes, bounds: Bounds) -> int | None:
    """The int under "id" among the first `bounds.map_len` entries of the header's map, the
    last one if several, read in order up to the first entry that cannot be read; None when
    there is none. Keys and ids are read within the bounds; other values are only followed
    to their end, never built (as msgpack's Unpacker.skip does)."""
    reader = _Reader(header, bounds)
    found = None
    try:
        head = reader.container(checked=False)
        if head is None or not head[0] or not _names_id(header, 0):
            return None
        for _ in range(min(head[1], bounds.map_len)):
            if reader.value(checked=True) != "id":
                reader.value(checked=False)
                continue
            value = reader.value(checked=True)
            found = value if type(value) is int else None
            if not _names_id(header, reader.pos):
                break  # no later "id" key: the rest need not be walked
    except ScanError:
        pass  # whatever stops the reading, the id read so far, if any, is the header's
    return found


# The key "id" as msgpack can write it (fixstr, str 8, 16, 32).
_ID_KEYS = (b"\xa2id", b"\xd9\x02id", b"\xda\x00\x02id", b"\xdb\x00\x00\x00\x02id")


def _names_id(header: bytes, start: int) -> bool:
    """Whether a key "id" may come at or after `start`: a byte search, so that a header
    whose id came early is not walked to its end (a hostile one costs its decode, no more)."""
    return any(header.find(key, start) >= 0 for key in _ID_KEYS)
