"""The native recorder's base64 (every block's data goes through it) writes exactly what
Python's base64 writes, on every path this CPU has: AVX2, SSSE3 and the scalar one."""

import base64
import random

import pytest

from commscope.record import native

IMPLS = {0: "best", 1: "scalar", 2: "ssse3", 3: "avx2"}


@pytest.fixture(scope="module")
def module():
    m = native.load()
    if m is None:
        pytest.skip(f"native recorder not built: {native.error()}")
    return m


@pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS.values()))
def test_native_base64_matches_python(module, impl):
    if module._base64(b"", impl) is None:
        pytest.skip(f"this CPU has no {IMPLS[impl]}")
    rng = random.Random(impl)
    for n in range(301):  # every tail and lane boundary of the vector paths, several times over
        for data in (bytes(n), b"\xff" * n, bytes(range(256)) * 2, rng.randbytes(n)):
            data = data[:n]
            assert module._base64(data, impl) == base64.b64encode(data), (n, data)
    for n in (1000, 4096, 65537):  # larger buffers, the size drained per tick
        data = rng.randbytes(n)
        assert module._base64(data, impl) == base64.b64encode(data)
    # every 6-bit value in every position of a group
    data = bytes((i * 7 + j) & 0xFF for i in range(256) for j in range(3))
    assert module._base64(data, impl) == base64.b64encode(data)


def test_native_base64_unknown_impl(module):
    assert module._base64(b"abc", 99) is None
