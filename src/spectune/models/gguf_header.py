"""A GGUF file's header, read without parsing what nobody asks for.

``gguf.GGUFReader`` builds a numpy view for every item of every metadata array: seconds for
a 49,152-token vocabulary, far more for Gemma 3's 262,144 tokens. The questions asked before
a model loads (``spectune.models.facts``) need a handful of scalar fields, the length of
the vocabulary and the tensors' names and storage types, so this reader walks the header
once, keeps the scalars and strings, and records only the length of each array (string
arrays are stepped over item by item; other arrays in one jump).

Layout (GGUF v2/v3, little-endian): magic ``GGUF``, version u32, tensor count u64,
metadata count u64; each metadata entry is a key (u64 length + UTF-8), a value type u32 and
the value (an array: item type u32, count u64, items); then each tensor's name, dimension
count u32, dimensions u64 each, storage type u32 and data offset u64.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from spectune.errors import ModelLoadError

__all__ = ["GGUFHeader", "read_gguf_header"]

_STRING, _ARRAY = 8, 9
# value type -> struct format of its fixed-size items (STRING and ARRAY are walked).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
Scalar = int | float | bool | str


@dataclass(frozen=True)
class GGUFHeader:
    """``fields``: every scalar and string entry; ``array_lengths``: every array entry's item
    count (its items are not kept); ``tensor_types``: each tensor's name -> its storage
    type number (``gguf.GGMLQuantizationType``)."""

    fields: dict[str, Scalar]
    array_lengths: dict[str, int]
    tensor_types: dict[str, int]


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def unpack(self, fmt: str) -> Scalar:
        value: Scalar = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def count(self) -> int:
        value = struct.unpack_from("<Q", self.data, self.at)[0]
        self.at += 8
        return int(value)

    def string(self) -> str:
        length = self.count()
        text = bytes(self.data[self.at : self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def skip_strings(self, count: int) -> None:
        data, at, unpack = self.data, self.at, struct.unpack_from
        for _ in range(count):  # the hot loop of a large vocabulary: no method calls
            at += 8 + unpack("<Q", data, at)[0]
        self.at = at


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at ``path`` (``GGUFHeader``); a file that is no GGUF, or
    is cut short, raises ``ModelLoadError``."""
    try:
        with (
            path.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return _read(_Cursor(data))
    except (OSError, ValueError, struct.error, IndexError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc


def _read(cursor: _Cursor) -> GGUFHeader:
    if bytes(cursor.data[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    cursor.at = 4
    version = int(cursor.unpack("<I"))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (2 or later)")
    tensors, entries = cursor.count(), cursor.count()
    fields: dict[str, Scalar] = {}
    lengths: dict[str, int] = {}
    for _ in range(entries):
        key = cursor.string()
        kind = int(cursor.unpack("<I"))
        if kind == _ARRAY:
            item, count = int(cursor.unpack("<I")), cursor.count()
            lengths[key] = count
            if item == _STRING:
                cursor.skip_strings(count)
            elif item in _SCALARS:
                cursor.at += count * struct.calcsize(_SCALARS[item])
            else:  # arrays of arrays: no model file has them
                raise ValueError(f"{key}: unsupported array item type {item}")
        elif kind == _STRING:
            fields[key] = cursor.string()
        elif kind in _SCALARS:
            fields[key] = cursor.unpack(_SCALARS[kind])
        else:
            raise ValueError(f"{key}: unknown value type {kind}")
    types: dict[str, int] = {}
    for _ in range(tensors):
        name = cursor.string()
        dims = int(cursor.unpack("<I"))
        cursor.at += 8 * dims
        types[name] = int(cursor.unpack("<I"))
        cursor.at += 8  # data offset
    return GGUFHeader(fields, lengths, types)
