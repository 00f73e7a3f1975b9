// base64 of the drained blocks (scalar, SSSE3 and AVX2 encoders) and its test hook _base64.
// Apart: byte code with no recorder state in it, tested on its own against Python's base64.

#pragma once

namespace {

// ---------------------------------------------------------------- base64
// Standard base64 with padding (what Python's base64.b64encode writes).  The recorder
// thread encodes every drained byte, so the vector paths matter: AVX2 turns 24 bytes into
// 32 characters in about a dozen instructions, SSSE3 12 into 16; the scalar path (two
// characters per lookup) does the tail and every CPU without them.
const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The scalar encoder: whole groups of 3 bytes, then the padded tail.
void base64_scalar(const uint8_t* in, size_t n, char* out) {
  // Two output characters per lookup (12 bits of input): half the lookups and stores.
  static const uint16_t* T2 = [] {
    auto* t = new uint16_t[4096];
    for (int x = 0; x < 4096; x++) {
      char two[2] = {kB64[x >> 6], kB64[x & 63]};
      std::memcpy(&t[x], two, 2);
    }
    return t;
  }();
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t(in[i]) << 16) | (uint32_t(in[i + 1]) << 8) | in[i + 2];
    std::memcpy(out, &T2[v >> 12], 2);
    std::memcpy(out + 2, &T2[v & 0xFFF], 2);
    out += 4;
  }
  if (i < n) {
    uint32_t v = uint32_t(in[i]) << 16;
    if (i + 1 < n) v |= uint32_t(in[i + 1]) << 8;
    *out++ = kB64[v >> 18];
    *out++ = kB64[(v >> 12) & 63];
    *out++ = i + 1 < n ? kB64[(v >> 6) & 63] : '=';
    *out++ = '=';
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define COMMSCOPE_B64_X86 1
// The vector encoders (Muła and Lemire's method, as in aklomp/base64): each 32-bit lane
// takes 3 input bytes, splits them into four 6-bit indices (one per byte), and the
// indices become ASCII by adding an offset chosen by range (A-Z, a-z, 0-9, +, /).
// Both return how many input bytes they encoded (a multiple of 3); the caller finishes.
__attribute__((target("ssse3"))) size_t base64_ssse3(const uint8_t* in, size_t n, char* out) {
  const __m128i shuf = _mm_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
  const __m128i lut = _mm_setr_epi8(65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0);
  size_t i = 0;
  for (; i + 16 <= n; i += 12) {  // reads 16 bytes, encodes 12
    __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(in + i)), shuf);
    __m128i t0 = _mm_mulhi_epu16(_mm_and_si128(v, _mm_set1_epi32(0x0fc0fc00)), _mm_set1_epi32(0x04000040));
    __m128i t1 = _mm_mullo_epi16(_mm_and_si128(v, _mm_set1_epi32(0x003f03f0)), _mm_set1_epi32(0x01000010));
    __m128i idx = _mm_or_si128(t0, t1);
    __m128i k = _mm_subs_epu8(idx, _mm_set1_epi8(51));
    k = _mm_sub_epi8(k, _mm_cmpgt_epi8(idx, _mm_set1_epi8(25)));
    _mm_storeu_si128((__m128i*)(out + i / 3 * 4), _mm_add_epi8(idx, _mm_shuffle_epi8(lut, k)));
  }
  return i;
}

__attribute__((target("avx2"))) size_t base64_avx2(const uint8_t* in, size_t n, char* out) {
  const __m256i shuf = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,
                                        1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
  const __m256i lut = _mm256_setr_epi8(65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0,
                                       65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0);
  size_t i = 0;
  for (; i + 28 <= n; i += 24) {  // reads 28 bytes (two 16-byte lanes, 12 apart), encodes 24
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(in + i))),
                                        _mm_loadu_si128((const __m128i*)(in + i + 12)), 1);
    v = _mm256_shuffle_epi8(v, shuf);
    __m256i t0 = _mm256_mulhi_epu16(_mm256_and_si256(v, _mm256_set1_epi32(0x0fc0fc00)),
                                    _mm256_set1_epi32(0x04000040));
    __m256i t1 = _mm256_mullo_epi16(_mm256_and_si256(v, _mm256_set1_epi32(0x003f03f0)),
                                    _mm256_set1_epi32(0x01000010));
    __m256i idx = _mm256_or_si256(t0, t1);
    __m256i k = _mm256_subs_epu8(idx, _mm256_set1_epi8(51));
    k = _mm256_sub_epi8(k, _mm256_cmpgt_epi8(idx, _mm256_set1_epi8(25)));
    _mm256_storeu_si256((__m256i*)(out + i / 3 * 4), _mm256_add_epi8(idx, _mm256_shuffle_epi8(lut, k)));
  }
  return i;
}
#endif

enum B64Impl : int { B64_AUTO = 0, B64_SCALAR = 1, B64_SSSE3 = 2, B64_AVX2 = 3 };

// The best encoder this CPU has (asked once).
int base64_best() {
#ifdef COMMSCOPE_B64_X86
  static const int best = __builtin_cpu_supports("avx2") ? B64_AVX2 : __builtin_cpu_supports("ssse3") ? B64_SSSE3 : B64_SCALAR;
  return best;
#else
  return B64_SCALAR;
#endif
}

bool base64_available(int impl) {
  if (impl == B64_AUTO || impl == B64_SCALAR) return true;
#ifdef COMMSCOPE_B64_X86
  if (impl == B64_SSSE3) return base64_best() >= B64_SSSE3;
  if (impl == B64_AVX2) return base64_best() == B64_AVX2;
#endif
  return false;
}

// base64 of in[0, n) into out (4 * ceil(n / 3) characters, no terminator).
void base64_encode(const uint8_t* in, size_t n, char* out, int impl = B64_AUTO) {
  if (impl == B64_AUTO) impl = base64_best();
  size_t done = 0;
#ifdef COMMSCOPE_B64_X86
  if (impl == B64_AVX2) done = base64_avx2(in, n, out);
  if (impl >= B64_SSSE3) done += base64_ssse3(in + done, n - done, out + done / 3 * 4);
#endif
  base64_scalar(in + done, n - done, out + done / 3 * 4);
}

// _base64(data, impl=0) -> bytes, or None where this CPU lacks impl (0 best, 1 scalar,
// 2 SSSE3, 3 AVX2): the tests compare every path with Python's base64.
PyObject* py_base64(PyObject*, PyObject* args) {
  Py_buffer in;
  int impl = B64_AUTO;
  if (!PyArg_ParseTuple(args, "y*|i", &in, &impl)) return nullptr;
  if (!base64_available(impl)) {
    PyBuffer_Release(&in);
    Py_RETURN_NONE;
  }
  size_t n = size_t(in.len);
  PyObject* out = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(4 * ((n + 2) / 3)));
  if (out != nullptr) base64_encode(static_cast<const uint8_t*>(in.buf), n, PyBytes_AS_STRING(out), impl);
  PyBuffer_Release(&in);
  return out;
}

}  // namespace
