/* mxfp4_repack(dst, src, width, stride, first, count): MXFP4 blocks from the
 * checkpoint's nibble order (byte k of a block's 16 data bytes: elements 2k
 * in the low nibble, 2k+1 in the high one) into ggml's (byte j: elements j
 * and j+16), the E8M0 scale byte kept first.  The blocks are numbered as
 * rows of `width` blocks, row r at byte r * stride of `src`: output block i
 * (17 bytes at 17 * i of `dst`) is input block first + i.  Runs without the
 * GIL.
 *
 * accel_mxfp4_blocks(out, in, count): the same of `count` blocks end to end
 * at `in` into `out`, for C callers (the read gate). */
#include "accel.h"

#include <string.h>

#define BLOCK 17

#if defined(__SSE2__)
#include <emmintrin.h>

/* The 16 data bytes' low and high nibbles apart; bytes 8-15 of each moved
 * under bytes 0-7 a nibble up (no bit crosses a byte: each is below 16);
 * the two interleaved byte by byte are ggml's 16 data bytes. */
static inline void repack_block(uint8_t *out, const uint8_t *in)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(in + 1)), m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    __m128i even = _mm_or_si128(lo, _mm_slli_epi16(_mm_srli_si128(lo, 8), 4));
    __m128i odd = _mm_or_si128(hi, _mm_slli_epi16(_mm_srli_si128(hi, 8), 4));
    out[0] = in[0];
    _mm_storeu_si128((__m128i *)(out + 1), _mm_unpacklo_epi8(even, odd));
}
#else
static const uint64_t LOW = 0x0F0F0F0F0F0F0F0FULL;

/* The 4 bytes of x each widened to a 16-bit lane, in the lane's low byte. */
static inline uint64_t spread(uint32_t x)
{
    uint64_t v = x;
    v = (v | (v << 16)) & 0x0000FFFF0000FFFFULL;
    v = (v | (v << 8)) & 0x00FF00FF00FF00FFULL;
    return v;
}

/* ggml byte 2i: L[i]'s low nibble under H[i]'s low one; byte 2i+1: L[i]'s
 * high nibble under H[i]'s high one (L: data bytes 0-7, H: 8-15). */
static inline void repack_block(uint8_t *out, const uint8_t *in)
{
    uint64_t l, h;
    memcpy(&l, in + 1, 8);
    memcpy(&h, in + 9, 8);
    uint64_t even = (l & LOW) | ((h & LOW) << 4);
    uint64_t odd = ((l >> 4) & LOW) | (h & ~LOW);
    uint64_t w0 = spread((uint32_t)even) | (spread((uint32_t)odd) << 8);
    uint64_t w1 = spread((uint32_t)(even >> 32)) | (spread((uint32_t)(odd >> 32)) << 8);
    out[0] = in[0];
    memcpy(out + 1, &w0, 8);
    memcpy(out + 9, &w1, 8);
}
#endif

void accel_mxfp4_blocks(uint8_t *out, const uint8_t *in, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        repack_block(out + i * BLOCK, in + i * BLOCK);
}

PyObject *accel_mxfp4_repack(PyObject *self, PyObject *args)
{
    Py_buffer dst, src;
    Py_ssize_t width, stride, first, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*nnnn", &dst, &src, &width, &stride, &first, &count))
        return NULL;
    const char *bad = NULL;
    if (width <= 0 || width > PY_SSIZE_T_MAX / BLOCK || stride < 0 || first < 0 || count < 0
            || first > PY_SSIZE_T_MAX - count)
        bad = "mxfp4_repack: negative or oversized width, stride, first or count";
    else if (count > dst.len / BLOCK)
        bad = "mxfp4_repack: the output buffer is shorter than count blocks";
    else if (count) {
        Py_ssize_t r1 = (first + count - 1) / width, c1 = (first + count - 1) % width;
        /* the furthest block: the last one, or the end of the row before it */
        Py_ssize_t rows_before = r1 > first / width ? r1 - 1 : -1;
        if (r1 > (PY_SSIZE_T_MAX - width * BLOCK) / (stride ? stride : 1))
            bad = "mxfp4_repack: rows beyond any buffer";
        else if (r1 * stride + (c1 + 1) * BLOCK > src.len
                 || (rows_before >= 0 && rows_before * stride + width * BLOCK > src.len))
            bad = "mxfp4_repack: the input buffer is shorter than the blocks it must hold";
    }
    if (bad) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    uint8_t *out = dst.buf;
    const uint8_t *in = src.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t r = first / width, c = first % width;
    for (Py_ssize_t i = 0; i < count; i++) {
        repack_block(out + i * BLOCK, in + r * stride + c * BLOCK);
        if (++c == width) {
            c = 0;
            r++;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}
