"""A GGUF file's metadata and tensor table, read in one pass over its header; tensor data stays memory-mapped.

`gguf.GGUFReader` builds a numpy view per metadata item: ~10 s for SmolLM2's 100k tokenizer strings on a
2-core machine, most of a start-up's model load. This reads the same header (little-endian GGUF v2/v3) with
struct and numpy in bulk, in well under a second, and gives tensors the same data arrays GGUFReader does."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types: scalar struct formats by type id (8 = string, 9 = array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_PLAIN_DTYPES = {  # tensor types stored as plain numbers (the rest are byte blocks the gguf package decodes)
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # ggml order (innermost first), uint64, as GGUFReader gives it
    data: np.ndarray  # numpy order; uint8 rows of blocks for quantized types


class GGUFFile:
    """fields: key -> Python value (str, int, float, bool or list); tensors in file order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._buf = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._mem = memoryview(self._buf)
        self._pos = 0
        if bytes(self._mem[:4]) != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", self._mem, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or 3, little-endian)")
        self._pos = 4 + 4 + 8 + 8
        self.fields: dict[str, object] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"))
        table = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in table]

    def _unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self._mem, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self, errors: str = "strict") -> str:
        n = self._unpack("<Q")
        text = bytes(self._mem[self._pos : self._pos + n]).decode("utf-8", errors=errors)
        self._pos += n
        return text

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._unpack("<I"), self._unpack("<Q")
            if item == _STRING:  # arrays of strings decode leniently, as the loader always did
                return [self._string("replace") for _ in range(count)]
            if item == _ARRAY:
                return [self._value(self._unpack("<I")) for _ in range(count)]
            fmt = "<" + _SCALARS[item]
            size = struct.calcsize(fmt)
            values = np.frombuffer(self._buf, np.dtype(fmt), count, self._pos).tolist()
            self._pos += size * count
            return values
        return self._unpack("<" + _SCALARS[kind])

    def _tensor_info(self) -> tuple[str, np.ndarray, int, int]:
        name = self._string()
        n_dims = self._unpack("<I")
        dims = np.frombuffer(self._buf, np.uint64, n_dims, self._pos).copy()
        self._pos += 8 * n_dims
        kind, offset = self._unpack("<I"), self._unpack("<Q")
        return name, dims, kind, offset

    def _tensor(self, start: int, name: str, dims: np.ndarray, kind: int, offset: int) -> GGUFTensor:
        ggml_type = GGMLQuantizationType(kind)
        shape = tuple(int(d) for d in reversed(dims.tolist()))
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        n_bytes = int(np.prod(shape)) * type_size // block
        raw = self._buf[start + offset : start + offset + n_bytes]
        if ggml_type in _PLAIN_DTYPES:
            data = raw.view(_PLAIN_DTYPES[ggml_type]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
        return GGUFTensor(name, ggml_type, dims, data)
