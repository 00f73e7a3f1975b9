"""Tensor element types by their C++ (c10) names, as torch names them in Python.

The native recorder writes c10 ScalarType codes and Flight Recorder writes c10 names
("Float", "BFloat16", "Float8_e4m3fn"); traces and reports use torch's Python names
("float32", "bfloat16", "float8_e4m3fn").  Torch-free, so readers can use it.
"""

from __future__ import annotations

#: c10 name -> (torch name, bytes per element; 0 where elements are not whole bytes)
C10: dict[str, tuple[str, int]] = {
    "Byte": ("uint8", 1), "Char": ("int8", 1), "Short": ("int16", 2), "Int": ("int32", 4),
    "Long": ("int64", 8), "Half": ("float16", 2), "Float": ("float32", 4), "Double": ("float64", 8),
    "ComplexHalf": ("complex32", 4), "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Bool": ("bool", 1), "QInt8": ("qint8", 1), "QUInt8": ("quint8", 1), "QInt32": ("qint32", 4),
    "BFloat16": ("bfloat16", 2), "QUInt4x2": ("quint4x2", 1), "QUInt2x4": ("quint2x4", 1),
    "Bits1x8": ("bits1x8", 1), "Bits2x4": ("bits2x4", 1), "Bits4x2": ("bits4x2", 1), "Bits8": ("bits8", 1),
    "Bits16": ("bits16", 2), "Float8_e5m2": ("float8_e5m2", 1), "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1), "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8),
    "Float8_e8m0fnu": ("float8_e8m0fnu", 1), "Float4_e2m1fn_x2": ("float4_e2m1fn_x2", 1),
    **{f"UInt{k}": (f"uint{k}", 0) for k in range(1, 8)},
    **{f"Int{k}": (f"int{k}", 0) for k in range(1, 8)},
}

#: c10::ScalarType codes in enum order (stable across torch releases: new types are
#: appended).  A trace's ``meta`` carries its own table; this one is the fallback.
CODES: tuple[str, ...] = (
    "Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "ComplexHalf", "ComplexFloat",
    "ComplexDouble", "Bool", "QInt8", "QUInt8", "QInt32", "BFloat16", "QUInt4x2", "QUInt2x4", "Bits1x8",
    "Bits2x4", "Bits4x2", "Bits8", "Bits16", "Float8_e5m2", "Float8_e4m3fn", "Float8_e5m2fnuz",
    "Float8_e4m3fnuz", "UInt16", "UInt32", "UInt64", "UInt1", "UInt2", "UInt3", "UInt4", "UInt5", "UInt6",
    "UInt7", "Int1", "Int2", "Int3", "Int4", "Int5", "Int6", "Int7", "Float8_e8m0fnu", "Float4_e2m1fn_x2",
)


def torch_name(c10_name: str) -> str:
    """'BFloat16' -> 'bfloat16'; an unknown name is lowercased."""
    hit = C10.get(c10_name)
    return hit[0] if hit else str(c10_name).lower()


def itemsize(c10_name: str) -> int:
    """Bytes per element of a c10 type; 0 when unknown or not whole bytes."""
    hit = C10.get(c10_name)
    return hit[1] if hit else 0
