/*
 * tqstore._native._frames: compiled record hot path.
 *
 * Same functions, arguments, results, exceptions and bytes as tqstore/_native/_pure.py
 * (crc32c, build_header, frame_head, frame_tail, encode_frames, check_frames, gather_frames,
 * copy_ranges, restamp_frames, pread_ranges, leaf_room, leaf_columns)
 * (the reference).  Layout constants repeat tqstore/_native/layout.py and are exposed as
 * ``_LAYOUT`` so the tests can check them against it.
 *
 * CRC32C: SSE4.2 crc32 instruction, three interleaved streams combined with zero-shift
 * tables, chosen at import by CPU detection; slice-by-8 tables otherwise.
 *
 * The GIL is released around work on >= 64 KiB (CRC of a large buffer, framing and
 * verification of many frames, the leaf pages of an LMDB database); all Python objects are
 * converted and all buffers acquired before, and all results created after, with the GIL
 * held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(TQSTORE_NO_SSE42)
#define TQ_X86_CRC 1
#include <nmmintrin.h>
#endif

/* ---- layout (tqstore/_native/layout.py) ---------------------------------------- */

#define FRAME_MAGIC "TQFR"
#define FRAME_END_MAGIC "TQFE"
#define FRAME_VERSION 1
#define ALIGN 64
#define PREFIX_SIZE 24      /* <4sBBHQQ: magic, version, flags, header_len, payload_len, raw_len */
#define HEADER_HEAD_SIZE 12 /* <QBBBB: gidx, kind, dtype, ndim, field_len */
#define TRAILER_SIZE 8      /* <I4s: crc32c, end magic */
#define INDEX_KEY_HEAD_SIZE 8 /* >Q gidx */
#define INDEX_VALUE_SIZE 20   /* <IQII: segment id, offset, frame length, crc */
#define MAX_FIELD_BYTES 255
#define MAX_NDIM 32
#define MAX_HEADER_LEN 0xFFFF

#define NOGIL_THRESHOLD ((size_t)64 * 1024)

static inline uint64_t align_up(uint64_t n) { return (n + (ALIGN - 1)) & ~(uint64_t)(ALIGN - 1); }

static inline void put_le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_be64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
/* One unit-index (key, value) pair as a new tuple, or NULL with an exception set: key =
 * >Q gidx + field name, value = <IQII segment id, offset, frame length, CRC32C (FORMAT.md). */
static PyObject *index_pair(const char *field, size_t flen, uint64_t gidx, uint32_t seg_id, uint64_t off,
                            uint32_t frame_len, uint32_t crc) {
    PyObject *key = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(INDEX_KEY_HEAD_SIZE + flen));
    if (!key) return NULL;
    uint8_t *kp = (uint8_t *)PyBytes_AS_STRING(key);
    put_be64(kp, gidx);
    if (flen) memcpy(kp + INDEX_KEY_HEAD_SIZE, field, flen);
    PyObject *val = PyBytes_FromStringAndSize(NULL, INDEX_VALUE_SIZE);
    if (!val) {
        Py_DECREF(key);
        return NULL;
    }
    uint8_t *vp = (uint8_t *)PyBytes_AS_STRING(val);
    put_le32(vp, seg_id);
    put_le64(vp + 4, off);
    put_le32(vp + 12, frame_len);
    put_le32(vp + 16, crc);
    PyObject *t = PyTuple_New(2);
    if (!t) {
        Py_DECREF(key);
        Py_DECREF(val);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, key);
    PyTuple_SET_ITEM(t, 1, val);
    return t;
}
static inline uint16_t get_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- CRC32C ------------------------------------------------------------------------ */

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli */

static uint32_t crc_table[8][256];

static void crc_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slice-by-8, portable (explicit little-endian word assembly). */
static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t len) {
    uint32_t c = crc ^ 0xffffffffu;
    while (len && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo = c ^ get_le32(p);
        uint32_t hi = get_le32(p + 4);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

#ifdef TQ_X86_CRC

/* Zero-shift operators (GF(2) matrices) to combine interleaved streams: after a stream
 * has run over L bytes, the state of a preceding stream is advanced by L zero bytes and
 * xored in.  Technique from Mark Adler's crc32c.c. */
#define CRC_LONG 8192
#define CRC_SHORT 256

static uint32_t crc_long[4][256];
static uint32_t crc_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* Operator that appends len (a power of two >= 1) zero bytes. */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    odd[0] = CRC32C_POLY;
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* 2 zero bits */
    gf2_square(odd, even); /* 4 zero bits */
    do {
        gf2_square(even, odd); /* 8, 32, ... bits */
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void zeros_table(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* x86-64 is little-endian */
    return v;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *next,
                                                                size_t len) {
    uint64_t crc0 = crc ^ 0xffffffffu, crc1, crc2;
    const uint8_t *end;

    while (len && ((uintptr_t)next & 7)) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    while (len >= 3 * CRC_LONG) {
        crc1 = 0;
        crc2 = 0;
        end = next + CRC_LONG;
        do {
            crc0 = _mm_crc32_u64(crc0, load64(next));
            crc1 = _mm_crc32_u64(crc1, load64(next + CRC_LONG));
            crc2 = _mm_crc32_u64(crc2, load64(next + 2 * CRC_LONG));
            next += 8;
        } while (next < end);
        crc0 = crc_shift(crc_long, (uint32_t)crc0) ^ crc1;
        crc0 = crc_shift(crc_long, (uint32_t)crc0) ^ crc2;
        next += 2 * CRC_LONG;
        len -= 3 * CRC_LONG;
    }
    while (len >= 3 * CRC_SHORT) {
        crc1 = 0;
        crc2 = 0;
        end = next + CRC_SHORT;
        do {
            crc0 = _mm_crc32_u64(crc0, load64(next));
            crc1 = _mm_crc32_u64(crc1, load64(next + CRC_SHORT));
            crc2 = _mm_crc32_u64(crc2, load64(next + 2 * CRC_SHORT));
            next += 8;
        } while (next < end);
        crc0 = crc_shift(crc_short, (uint32_t)crc0) ^ crc1;
        crc0 = crc_shift(crc_short, (uint32_t)crc0) ^ crc2;
        next += 2 * CRC_SHORT;
        len -= 3 * CRC_SHORT;
    }
    end = next + (len - (len & 7));
    while (next < end) {
        crc0 = _mm_crc32_u64(crc0, load64(next));
        next += 8;
    }
    len &= 7;
    while (len--) crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
    return (uint32_t)crc0 ^ 0xffffffffu;
}
#endif /* TQ_X86_CRC */

typedef uint32_t (*crc_fn_t)(uint32_t, const uint8_t *, size_t);
static crc_fn_t crc_impl = crc32c_table;
static const char *crc_backend = "table";

static void x2n_init(void);

static void crc_init(void) {
    crc_table_init();
    x2n_init();
#ifdef TQ_X86_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        zeros_table(crc_long, CRC_LONG);
        zeros_table(crc_short, CRC_SHORT);
        crc_impl = crc32c_sse42;
        crc_backend = "sse4.2";
    }
#endif
}

/* Multiplication modulo the (reflected) polynomial and x^(n*2^k) mod P, for shifting a CRC
 * register through n zero bytes in O(log n) (technique from zlib's crc32_combine). */
/* x2n_table[i] = x^(2^i) mod P for every i a shift through a 64-bit byte count can reach
 * (3 + 63): not wrapped at 32 as zlib's table is (x^(2^32) mod P is x for zlib's polynomial,
 * not for CRC32C's: a wrapped table gives wrong shifts from 2^29 bytes on). */
#define X2N_SIZE 67
static uint32_t x2n_table[X2N_SIZE];

static uint32_t multmodp(uint32_t a, uint32_t b) { /* branch-free: 32 steps, x^0 is bit 31 */
    uint32_t p = 0;
    for (int i = 31; i >= 0; i--) {
        p ^= b & (0u - ((a >> i) & 1u));
        b = (b >> 1) ^ (CRC32C_POLY & (0u - (b & 1u)));
    }
    return p;
}

static uint32_t x2nmodp(uint64_t n, unsigned k) {
    uint32_t p = (uint32_t)1 << 31; /* x^0 */
    while (n) {
        if (n & 1) p = multmodp(x2n_table[k], p);
        n >>= 1;
        k++;
    }
    return p;
}

static void x2n_init(void) {
    uint32_t p = (uint32_t)1 << 30; /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < X2N_SIZE; n++) x2n_table[n] = p = multmodp(p, p);
}

/* The CRC32C of a message of `cover` bytes whose bytes [at, at + 8) change by `delta` (xor),
 * from the message's CRC32C `crc`: CRC32C is affine, so the change is the zero-initialised
 * CRC of the delta advanced through the cover - at - 8 bytes after it. */
static uint32_t crc_patch8(uint32_t crc, const uint8_t *delta, uint64_t at, uint64_t cover) {
    uint32_t g = 0;
    for (int i = 0; i < 8; i++) g = crc_table[0][(g ^ delta[i]) & 0xff] ^ (g >> 8);
    if (!g) return crc;
    return crc ^ multmodp(x2nmodp(cover - at - 8, 3), g);
}

/* ---- argument helpers -------------------------------------------------------------- */

/* METH_FASTCALL|METH_KEYWORDS parsing with the pure functions' parameter names. */
static int parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int nreq, int ntot, PyObject **out) {
    for (int i = 0; i < ntot; i++) out[i] = NULL;
    if (nargs > ntot) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments but %zd were given", fname,
                     ntot, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int j;
            for (j = 0; j < ntot; j++)
                if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) break;
            if (j == ntot) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
                return -1;
            }
            if (out[j]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                             names[j]);
                return -1;
            }
            out[j] = args[nargs + k];
        }
    }
    for (int i = 0; i < nreq; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

/* operator.index(o), then 0 <= v < 2**bits else OverflowError (same message as _pure._uint). */
static int as_uint(PyObject *o, int bits, const char *what, uint64_t *out) {
    PyObject *v = PyNumber_Index(o);
    if (!v) return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    int bad = 0;
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            Py_DECREF(v);
            return -1;
        }
        PyErr_Clear();
        bad = 1;
    } else if (bits < 64 && (x >> bits)) {
        bad = 1;
    }
    if (bad) {
        PyErr_Format(PyExc_OverflowError, "%s must be in [0, 2**%d), got %R", what, bits, v);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    *out = x;
    return 0;
}

/* bytes(memoryview(o)) unless o is exactly bytes (as _pure._as_bytes).  New reference. */
static PyObject *as_bytes(PyObject *o) {
    if (PyBytes_CheckExact(o)) {
        Py_INCREF(o);
        return o;
    }
    PyObject *mv = PyMemoryView_FromObject(o);
    if (!mv) return NULL;
    PyObject *b = PyObject_Bytes(mv);
    Py_DECREF(mv);
    return b;
}

static PyObject *field_bytes(PyObject *o) {
    PyObject *b = as_bytes(o);
    if (b && PyBytes_GET_SIZE(b) > MAX_FIELD_BYTES) {
        PyErr_Format(PyExc_ValueError, "field name is %zd bytes, at most %d allowed", PyBytes_GET_SIZE(b),
                     MAX_FIELD_BYTES);
        Py_CLEAR(b);
    }
    return b;
}

/* tuple(shape), at most MAX_NDIM entries, each a u64.  Returns ndim or -1. */
static int get_dims(PyObject *shape, uint64_t *dims) {
    PyObject *seq = PySequence_Fast(shape, "shape must be an iterable of ints");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "shape has %zd dimensions, at most %d allowed", n, MAX_NDIM);
        Py_DECREF(seq);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (as_uint(items[k], 64, "shape dimension", &dims[k]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return (int)n;
}

static inline size_t header_len(size_t flen, int ndim) { return HEADER_HEAD_SIZE + flen + 8 * (size_t)ndim; }

static void write_header(uint8_t *p, const uint8_t *field, size_t flen, uint8_t kind, uint8_t dtype,
                         uint64_t gidx, const uint64_t *dims, int ndim) {
    put_le64(p, gidx);
    p[8] = kind;
    p[9] = dtype;
    p[10] = (uint8_t)ndim;
    p[11] = (uint8_t)flen;
    if (flen) memcpy(p + 12, field, flen);
    p += 12 + flen;
    for (int k = 0; k < ndim; k++) put_le64(p + 8 * k, dims[k]);
}

static void write_prefix(uint8_t *p, uint8_t flags, uint16_t hlen, uint64_t plen, uint64_t raw) {
    memcpy(p, FRAME_MAGIC, 4);
    p[4] = FRAME_VERSION;
    p[5] = flags;
    put_le16(p + 6, hlen);
    put_le64(p + 8, plen);
    put_le64(p + 16, raw);
}

/* Payload buffer with the checks of _pure: any buffer (TypeError), C-contiguous
 * (BufferError). */
static int get_payload(PyObject *o, Py_ssize_t i, Py_buffer *view) {
    if (PyObject_GetBuffer(o, view, PyBUF_FULL_RO) < 0) return -1;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_BufferError, "payload %zd is not C-contiguous", i);
        return -1;
    }
    return 0;
}

/* ---- crc32c ------------------------------------------------------------------------ */

static PyObject *py_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"data", "value"};
    PyObject *a[2];
    if (parse_args("crc32c", args, nargs, kwnames, names, 1, 2, a) < 0) return NULL;
    uint32_t value = 0;
    Py_buffer view;
    if (PyObject_GetBuffer(a[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (a[1]) {
        PyObject *v = PyNumber_Index(a[1]);
        if (!v) {
            PyBuffer_Release(&view);
            return NULL;
        }
        value = (uint32_t)(PyLong_AsUnsignedLongLongMask(v) & 0xffffffffu);
        Py_DECREF(v);
        if (PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    uint32_t crc;
    size_t len = (size_t)view.len;
    if (len >= NOGIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS crc = crc_impl(value, (const uint8_t *)view.buf, len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_impl(value, (const uint8_t *)view.buf, len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* Private: the slice-by-8 fallback, for tests. */
static PyObject *py_crc32c_table(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned long long value = 0;
    if (!PyArg_ParseTuple(args, "y*|K:_crc32c_table", &view, &value)) return NULL;
    uint32_t crc = crc32c_table((uint32_t)value, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* ---- build_header / frame_head / frame_tail ---------------------------------------- */

static PyObject *py_build_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static const char *const names[] = {"field", "kind", "dtype", "gidx", "shape"};
    PyObject *a[5];
    if (parse_args("build_header", args, nargs, kwnames, names, 5, 5, a) < 0) return NULL;
    uint64_t kind, dtype, gidx, dims[MAX_NDIM];
    PyObject *field = field_bytes(a[0]);
    if (!field) return NULL;
    int ndim;
    if (as_uint(a[1], 8, "kind", &kind) < 0 || as_uint(a[2], 8, "dtype", &dtype) < 0 ||
        as_uint(a[3], 64, "gidx", &gidx) < 0 || (ndim = get_dims(a[4], dims)) < 0) {
        Py_DECREF(field);
        return NULL;
    }
    size_t flen = (size_t)PyBytes_GET_SIZE(field);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)header_len(flen, ndim));
    if (out)
        write_header((uint8_t *)PyBytes_AS_STRING(out), (const uint8_t *)PyBytes_AS_STRING(field), flen,
                     (uint8_t)kind, (uint8_t)dtype, gidx, dims, ndim);
    Py_DECREF(field);
    return out;
}

static PyObject *py_frame_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"header", "payload_len", "flags", "raw_len"};
    PyObject *a[4];
    if (parse_args("frame_head", args, nargs, kwnames, names, 4, 4, a) < 0) return NULL;
    PyObject *header = as_bytes(a[0]);
    if (!header) return NULL;
    Py_ssize_t hlen = PyBytes_GET_SIZE(header);
    if (hlen > MAX_HEADER_LEN) {
        PyErr_Format(PyExc_ValueError, "header is %zd bytes, at most %d allowed", hlen, MAX_HEADER_LEN);
        Py_DECREF(header);
        return NULL;
    }
    uint64_t plen, flags, raw;
    if (as_uint(a[1], 64, "payload_len", &plen) < 0 || as_uint(a[2], 8, "flags", &flags) < 0 ||
        as_uint(a[3], 64, "raw_len", &raw) < 0) {
        Py_DECREF(header);
        return NULL;
    }
    size_t total = (size_t)align_up(PREFIX_SIZE + (uint64_t)hlen);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out) {
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
        write_prefix(p, (uint8_t)flags, (uint16_t)hlen, plen, raw);
        memcpy(p + PREFIX_SIZE, PyBytes_AS_STRING(header), (size_t)hlen);
        memset(p + PREFIX_SIZE + hlen, 0, total - PREFIX_SIZE - (size_t)hlen);
    }
    Py_DECREF(header);
    return out;
}

static PyObject *py_frame_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"crc", "end"};
    PyObject *a[2];
    if (parse_args("frame_tail", args, nargs, kwnames, names, 2, 2, a) < 0) return NULL;
    uint64_t crc;
    if (as_uint(a[0], 32, "crc", &crc) < 0) return NULL;
    PyObject *e = PyNumber_Index(a[1]);
    if (!e) return NULL;
    /* (-(end + 8)) % 64 for any integer end: only end mod 2**64 matters. */
    uint64_t m = (uint64_t)PyLong_AsUnsignedLongLongMask(e);
    Py_DECREF(e);
    if (m == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    size_t pad = (size_t)((0 - (m + TRAILER_SIZE)) & (ALIGN - 1));
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(TRAILER_SIZE + pad));
    if (out) {
        uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
        put_le32(p, (uint32_t)crc);
        memcpy(p + 4, FRAME_END_MAGIC, 4);
        memset(p + TRAILER_SIZE, 0, pad);
    }
    return out;
}

/* ---- encode_frames ----------------------------------------------------------------- */

typedef struct {
    uint64_t gidx;
    uint64_t raw;
    uint64_t off;      /* frame offset (base_offset-relative value for the index) */
    size_t pos;        /* position in the blob */
    size_t dims_at;    /* index of the first dim in the dims array */
    uint32_t frame_len;
    uint32_t crc;
    uint16_t hlen;
    uint8_t ndim;
} enc_item;

/* Copy the payload and fold it into the CRC chunk by chunk, so each chunk is checksummed
 * while still in cache. */
#define COPY_CHUNK ((size_t)128 * 1024)

static uint32_t copy_crc(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t len) {
    while (len) {
        size_t n = len < COPY_CHUNK ? len : COPY_CHUNK;
        memcpy(dst, src, n);
        crc = crc_impl(crc, dst, n);
        dst += n;
        src += n;
        len -= n;
    }
    return crc;
}

static void encode_all(uint8_t *blob, const enc_item *items, const Py_buffer *views, Py_ssize_t n,
                       const uint64_t *dims, const uint8_t *field, size_t flen, uint8_t kind, uint8_t dtype,
                       uint8_t flags, uint32_t *crcs) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const enc_item *it = &items[i];
        uint8_t *p = blob + it->pos;
        size_t plen = (size_t)views[i].len;
        size_t pstart = (size_t)align_up(PREFIX_SIZE + (uint64_t)it->hlen);
        size_t end = pstart + plen;
        write_prefix(p, flags, it->hlen, plen, it->raw);
        write_header(p + PREFIX_SIZE, field, flen, kind, dtype, it->gidx, dims + it->dims_at, it->ndim);
        memset(p + PREFIX_SIZE + it->hlen, 0, pstart - PREFIX_SIZE - it->hlen);
        uint32_t crc = crc_impl(0, p, pstart);
        crc = copy_crc(crc, p + pstart, (const uint8_t *)views[i].buf, plen);
        put_le32(p + end, crc);
        memcpy(p + end + 4, FRAME_END_MAGIC, 4);
        memset(p + end + TRAILER_SIZE, 0, it->frame_len - end - TRAILER_SIZE);
        crcs[i] = crc;
    }
}

static PyObject *py_encode_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
    static const char *const names[] = {"field", "kind", "dtype", "gidxs", "shapes", "payloads",
                                        "flags", "raw_lens", "seg_id", "base_offset"};
    PyObject *a[10];
    if (parse_args("encode_frames", args, nargs, kwnames, names, 10, 10, a) < 0) return NULL;

    PyObject *field = NULL, *s_gidx = NULL, *s_shape = NULL, *s_payload = NULL, *s_raw = NULL;
    PyObject *blob = NULL, *list = NULL, *result = NULL;
    enc_item *items = NULL;
    Py_buffer *views = NULL;
    uint64_t *dims = NULL;
    uint32_t *crcs = NULL;
    Py_ssize_t nviews = 0, n = 0;
    uint64_t kind, dtype, flags, seg_id, base_offset;

    field = field_bytes(a[0]);
    if (!field) goto done;
    if (as_uint(a[1], 8, "kind", &kind) < 0 || as_uint(a[2], 8, "dtype", &dtype) < 0 ||
        as_uint(a[6], 8, "flags", &flags) < 0 || as_uint(a[8], 32, "seg_id", &seg_id) < 0 ||
        as_uint(a[9], 64, "base_offset", &base_offset) < 0)
        goto done;
    if (!(s_gidx = PySequence_Fast(a[3], "gidxs must be iterable"))) goto done;
    if (!(s_shape = PySequence_Fast(a[4], "shapes must be iterable"))) goto done;
    if (!(s_payload = PySequence_Fast(a[5], "payloads must be iterable"))) goto done;
    if (a[7] != Py_None && !(s_raw = PySequence_Fast(a[7], "raw_lens must be iterable"))) goto done;
    n = PySequence_Fast_GET_SIZE(s_gidx);
    if (PySequence_Fast_GET_SIZE(s_shape) != n || PySequence_Fast_GET_SIZE(s_payload) != n ||
        (s_raw && PySequence_Fast_GET_SIZE(s_raw) != n)) {
        PyErr_SetString(PyExc_ValueError, "gidxs, shapes, payloads and raw_lens must have the same length");
        goto done;
    }

    size_t flen = (size_t)PyBytes_GET_SIZE(field);
    size_t nalloc = n ? (size_t)n : 1;
    items = PyMem_Malloc(nalloc * sizeof(enc_item));
    views = PyMem_Malloc(nalloc * sizeof(Py_buffer));
    crcs = PyMem_Malloc(nalloc * sizeof(uint32_t));
    size_t dims_cap = nalloc * 2, dims_len = 0;
    dims = PyMem_Malloc(dims_cap * sizeof(uint64_t));
    if (!items || !views || !crcs || !dims) {
        PyErr_NoMemory();
        goto done;
    }

    /* Pass 1 (GIL held): convert and check every argument, acquire every payload,
     * lay the frames out.  Checks run in the pure version's order. */
    {
        uint64_t off = base_offset;
        int off_overflow = 0;
        size_t pos = 0;
        PyObject **g = PySequence_Fast_ITEMS(s_gidx);
        PyObject **sh = PySequence_Fast_ITEMS(s_shape);
        PyObject **pl = PySequence_Fast_ITEMS(s_payload);
        PyObject **rl = s_raw ? PySequence_Fast_ITEMS(s_raw) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            enc_item *it = &items[i];
            uint64_t d[MAX_NDIM];
            int ndim;
            if (as_uint(g[i], 64, "gidx", &it->gidx) < 0) goto done;
            if ((ndim = get_dims(sh[i], d)) < 0) goto done;
            if (get_payload(pl[i], i, &views[i]) < 0) goto done;
            nviews = i + 1;
            uint64_t plen = (uint64_t)views[i].len;
            if (rl) {
                if (as_uint(rl[i], 64, "raw_len", &it->raw) < 0) goto done;
            } else {
                it->raw = plen;
            }
            if (off_overflow) {
                PyErr_SetString(PyExc_OverflowError, "frame offset exceeds 2**64");
                goto done;
            }
            size_t hlen = header_len(flen, ndim);
            uint64_t frame_len = align_up(align_up(PREFIX_SIZE + hlen) + plen + TRAILER_SIZE);
            if (frame_len > 0xFFFFFFFFull) {
                PyErr_Format(PyExc_OverflowError, "frame of %llu bytes is too long for the index",
                             (unsigned long long)frame_len);
                goto done;
            }
            if (frame_len > (uint64_t)PY_SSIZE_T_MAX - pos) {
                PyErr_SetString(PyExc_OverflowError, "encoded frames too long");
                goto done;
            }
            if (dims_len + (size_t)ndim > dims_cap) {
                size_t cap = dims_cap * 2 + MAX_NDIM;
                uint64_t *nd = PyMem_Realloc(dims, cap * sizeof(uint64_t));
                if (!nd) {
                    PyErr_NoMemory();
                    goto done;
                }
                dims = nd;
                dims_cap = cap;
            }
            if (ndim) memcpy(dims + dims_len, d, (size_t)ndim * sizeof(uint64_t));
            it->dims_at = dims_len;
            dims_len += (size_t)ndim;
            it->ndim = (uint8_t)ndim;
            it->hlen = (uint16_t)hlen;
            it->frame_len = (uint32_t)frame_len;
            it->off = off;
            it->pos = pos;
            pos += (size_t)frame_len;
            if (off > UINT64_MAX - frame_len) off_overflow = 1;
            off += frame_len;
        }

        blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)pos);
        if (!blob) goto done;

        /* Pass 2: write every frame, without the GIL when there is enough to do. */
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(blob);
        const uint8_t *fp = (const uint8_t *)PyBytes_AS_STRING(field);
        if (pos >= NOGIL_THRESHOLD) {
            Py_BEGIN_ALLOW_THREADS encode_all(out, items, views, n, dims, fp, flen, (uint8_t)kind,
                                              (uint8_t)dtype, (uint8_t)flags, crcs);
            Py_END_ALLOW_THREADS
        } else {
            encode_all(out, items, views, n, dims, fp, flen, (uint8_t)kind, (uint8_t)dtype, (uint8_t)flags,
                       crcs);
        }
    }
    /* The payloads are copied: let them go before building the index items. */
    for (Py_ssize_t i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
    nviews = 0;

    /* Pass 3 (GIL): the index (key, value) pairs. */
    list = PyList_New(n);
    if (!list) goto done;
    {
        const char *fp = PyBytes_AS_STRING(field);
        for (Py_ssize_t i = 0; i < n; i++) {
            const enc_item *it = &items[i];
            PyObject *t = index_pair(fp, flen, it->gidx, (uint32_t)seg_id, it->off, it->frame_len, crcs[i]);
            if (!t) goto done;
            PyList_SET_ITEM(list, i, t);
        }
    }
    result = PyTuple_Pack(2, blob, list);

done:
    for (Py_ssize_t i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(items);
    PyMem_Free(views);
    PyMem_Free(dims);
    PyMem_Free(crcs);
    Py_XDECREF(field);
    Py_XDECREF(s_gidx);
    Py_XDECREF(s_shape);
    Py_XDECREF(s_payload);
    Py_XDECREF(s_raw);
    Py_XDECREF(blob);
    Py_XDECREF(list);
    return result;
}

/* ---- encode_rows: the frames of rows of one contiguous batch -------------------------- */

static PyObject *py_encode_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"field", "kind", "dtype", "gidxs", "shape", "data",
                                        "row_bytes", "rows", "seg_id", "base_offset"};
    PyObject *a[10];
    if (parse_args("encode_rows", args, nargs, kwnames, names, 10, 10, a) < 0) return NULL;

    PyObject *field = NULL, *s_gidx = NULL, *s_rows = NULL, *blob = NULL, *list = NULL, *result = NULL;
    uint64_t *gid = NULL, *rowi = NULL;
    uint32_t *crcs = NULL;
    Py_buffer view;
    int have_view = 0;
    uint64_t kind, dtype, seg_id, base_offset, row_bytes, dims[MAX_NDIM];
    int ndim;
    Py_ssize_t n = 0;

    if (as_uint(a[6], 64, "row_bytes", &row_bytes) < 0) goto done;
    if (PyObject_GetBuffer(a[5], &view, PyBUF_FULL_RO) < 0) goto done;
    have_view = 1;
    if (!PyBuffer_IsContiguous(&view, 'C')) {
        PyErr_SetString(PyExc_BufferError, "data is not C-contiguous");
        goto done;
    }
    if (!(s_gidx = PySequence_Fast(a[3], "gidxs must be iterable"))) goto done;
    n = PySequence_Fast_GET_SIZE(s_gidx);
    if (a[7] != Py_None) {
        if (!(s_rows = PySequence_Fast(a[7], "rows must be iterable"))) goto done;
        if (PySequence_Fast_GET_SIZE(s_rows) != n) {
            PyErr_SetString(PyExc_ValueError, "gidxs and rows must have the same length");
            goto done;
        }
    }
    size_t nalloc = n ? (size_t)n : 1;
    gid = PyMem_Malloc(nalloc * sizeof(uint64_t));
    rowi = PyMem_Malloc(nalloc * sizeof(uint64_t));
    crcs = PyMem_Malloc(nalloc * sizeof(uint32_t));
    if (!gid || !rowi || !crcs) {
        PyErr_NoMemory();
        goto done;
    }
    {
        uint64_t avail = row_bytes ? (uint64_t)view.len / row_bytes : UINT64_MAX;
        PyObject **rl = s_rows ? PySequence_Fast_ITEMS(s_rows) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t r = (uint64_t)i;
            if (rl && as_uint(rl[i], 64, "row", &r) < 0) goto done;
            if (row_bytes && r >= avail) {
                PyErr_Format(PyExc_IndexError, "row %llu of %llu bytes lies outside the %zd-byte data",
                             (unsigned long long)r, (unsigned long long)row_bytes, view.len);
                goto done;
            }
            rowi[i] = r;
        }
    }
    if (!(field = field_bytes(a[0]))) goto done;
    if (as_uint(a[1], 8, "kind", &kind) < 0 || as_uint(a[2], 8, "dtype", &dtype) < 0 ||
        as_uint(a[8], 32, "seg_id", &seg_id) < 0 || as_uint(a[9], 64, "base_offset", &base_offset) < 0)
        goto done;
    {
        PyObject **g = PySequence_Fast_ITEMS(s_gidx);
        for (Py_ssize_t i = 0; i < n; i++)
            if (as_uint(g[i], 64, "gidx", &gid[i]) < 0) goto done;
    }
    if ((ndim = get_dims(a[4], dims)) < 0) goto done;

    size_t flen = (size_t)PyBytes_GET_SIZE(field);
    size_t hlen = header_len(flen, ndim);
    uint64_t pstart = align_up(PREFIX_SIZE + (uint64_t)hlen);
    if (row_bytes > UINT64_MAX - pstart - 2 * ALIGN) {
        PyErr_SetString(PyExc_OverflowError, "frame too long for the index");
        goto done;
    }
    uint64_t frame_len = align_up(pstart + row_bytes + TRAILER_SIZE);
    if (frame_len > 0xFFFFFFFFull) {
        PyErr_Format(PyExc_OverflowError, "frame of %llu bytes is too long for the index",
                     (unsigned long long)frame_len);
        goto done;
    }
    if (n && (uint64_t)n > (uint64_t)PY_SSIZE_T_MAX / frame_len) {
        PyErr_SetString(PyExc_OverflowError, "encoded frames too long");
        goto done;
    }
    size_t total = (size_t)n * (size_t)frame_len;
    if (n && base_offset > UINT64_MAX - (total - frame_len)) {
        PyErr_SetString(PyExc_OverflowError, "frame offset exceeds 2**64");
        goto done;
    }
    if (!(blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total))) goto done;
    {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(blob);
        const uint8_t *fp = (const uint8_t *)PyBytes_AS_STRING(field);
        const uint8_t *src = (const uint8_t *)view.buf;
        size_t end = (size_t)(pstart + row_bytes);
        PyThreadState *ts = total >= NOGIL_THRESHOLD ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint8_t *p = out + (size_t)i * (size_t)frame_len;
            write_prefix(p, 0, (uint16_t)hlen, row_bytes, row_bytes);
            write_header(p + PREFIX_SIZE, fp, flen, (uint8_t)kind, (uint8_t)dtype, gid[i], dims, ndim);
            memset(p + PREFIX_SIZE + hlen, 0, (size_t)pstart - PREFIX_SIZE - hlen);
            uint32_t crc = crc_impl(0, p, (size_t)pstart);
            crc = copy_crc(crc, p + pstart, src + rowi[i] * row_bytes, (size_t)row_bytes);
            put_le32(p + end, crc);
            memcpy(p + end + 4, FRAME_END_MAGIC, 4);
            memset(p + end + TRAILER_SIZE, 0, (size_t)frame_len - end - TRAILER_SIZE);
            crcs[i] = crc;
        }
        if (ts) PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&view);
    have_view = 0;
    if (!(list = PyList_New(n))) goto done;
    {
        const char *fp = PyBytes_AS_STRING(field);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = index_pair(fp, flen, (uint64_t)gid[i], (uint32_t)seg_id,
                                     base_offset + (uint64_t)i * frame_len, (uint32_t)frame_len, crcs[i]);
            if (!t) goto done;
            PyList_SET_ITEM(list, i, t);
        }
    }
    result = PyTuple_Pack(2, blob, list);

done:
    if (have_view) PyBuffer_Release(&view);
    PyMem_Free(gid);
    PyMem_Free(rowi);
    PyMem_Free(crcs);
    Py_XDECREF(field);
    Py_XDECREF(s_gidx);
    Py_XDECREF(s_rows);
    Py_XDECREF(blob);
    Py_XDECREF(list);
    return result;
}

/* ---- the frame-check kernel -------------------------------------------------------- */

/* Per-frame status codes (same as _pure.FRAME_*; docs/FORMAT.md, "Record frame"): the
 * first check a frame fails, checks made in this order. */
#define C_OK 0
#define C_TRUNCATED 1 /* the frame's extent does not lie inside the buffer */
#define C_MAGIC 2     /* no frame magic */
#define C_VERSION 3   /* a frame version this reader does not read */
#define C_FLAGS 4     /* reserved flag bits or codec set */
#define C_HEADER 5    /* header length, layout, kind or field name (not UTF-8) malformed */
#define C_EXTENT 6    /* the frame's lengths do not add up to its extent */
#define C_SIZE 7      /* payload length disagrees with raw_len (raw codec) or dtype and shape */
#define C_GIDX 8      /* the header's gidx is not the expected one */
#define C_TORN 9      /* no end magic */
#define C_INDEX_CRC 10 /* the trailer's CRC is not the one the index recorded */
#define C_PADDING 11  /* trailing padding not zero */
#define C_CRC 12      /* CRC32C of prefix, header, header padding and payload differs */
#define C_DIFFERS 13  /* gather_frames only: index length or head differ from the template */

#define CODEC_MASK 0x03
#define CODEC_ZSTD 1
#define KIND_VALUE 2
#define NUM_DTYPES 18
/* bytes per element of each dtype code (layout.DTYPE_ITEMSIZE); 0: no elements (none) */
static const uint8_t dtype_itemsize[NUM_DTYPES] = {0, 1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16, 2, 4, 8, 1, 1};

static int is_zero(const uint8_t *p, size_t len) {
    while (len && ((uintptr_t)p & 7)) {
        if (*p++) return 0;
        len--;
    }
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (w) return 0;
    }
    while (len--)
        if (*p++) return 0;
    return 1;
}

/* Strict UTF-8, as Python's decoder: no overlong forms, no surrogates, at most U+10FFFF. */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i - 1 < k) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* The head checks of one frame lying whole at f (length len, inside the buffer), in the
 * order of the C_* codes up to C_SIZE.  On success sets *tpos (trailer offset). */
static int check_head(const uint8_t *f, uint64_t len, uint64_t *tpos) {
    if (len < PREFIX_SIZE) return C_EXTENT;
    if (memcmp(f, FRAME_MAGIC, 4) != 0) return C_MAGIC;
    if (f[4] != FRAME_VERSION) return C_VERSION;
    uint8_t flags = f[5];
    if ((flags & ~CODEC_MASK) || (flags & CODEC_MASK) > CODEC_ZSTD) return C_FLAGS;
    uint64_t hlen = get_le16(f + 6), plen = get_le64(f + 8), raw = get_le64(f + 16);
    if (hlen < HEADER_HEAD_SIZE || PREFIX_SIZE + hlen > len) return C_HEADER;
    const uint8_t *h = f + PREFIX_SIZE;
    uint8_t kind = h[8], dtype = h[9], ndim = h[10], flen = h[11];
    if (HEADER_HEAD_SIZE + (uint64_t)flen + 8 * (uint64_t)ndim != hlen || kind > KIND_VALUE) return C_HEADER;
    if (!utf8_valid(h + HEADER_HEAD_SIZE, flen)) return C_HEADER;
    uint64_t pstart = align_up(PREFIX_SIZE + hlen);
    /* align64(pstart + plen + 8) == len, without overflow */
    if (pstart + TRAILER_SIZE > len || plen > len - pstart - TRAILER_SIZE ||
        align_up(pstart + plen + TRAILER_SIZE) != len)
        return C_EXTENT;
    int zstd = (flags & CODEC_MASK) == CODEC_ZSTD;
    if (!zstd && raw != plen) return C_SIZE;
    if (kind != KIND_VALUE) {
        uint64_t need = dtype < NUM_DTYPES ? dtype_itemsize[dtype] : 0;
        if (!need) return C_SIZE;
        const uint8_t *d = h + HEADER_HEAD_SIZE + flen;
        int zero = 0, over = 0;
        for (int k = 0; k < ndim; k++) {
            uint64_t dim = get_le64(d + 8 * k);
            if (!dim) zero = 1;
            else if (!over && __builtin_mul_overflow(need, dim, &need)) over = 1;
        }
        if (zero) need = 0;
        else if (over) return C_SIZE;
        if (need != (zstd ? raw : plen)) return C_SIZE;
    }
    *tpos = pstart + plen;
    return C_OK;
}

/* The checks after the head (shared by check_frames and gather_frames), in the order of
 * the C_* codes from C_GIDX.  *tcrc gets the trailer's CRC, *ccrc the computed one. */
static inline int check_tail(const uint8_t *f, uint64_t tpos, uint64_t len, const uint8_t *want_gidx,
                             const uint8_t *icrc, int verify, uint32_t *tcrc, uint32_t *ccrc) {
    if (want_gidx && memcmp(f + PREFIX_SIZE, want_gidx, 8) != 0) return C_GIDX;
    const uint8_t *t = f + tpos;
    if (memcmp(t + 4, FRAME_END_MAGIC, 4) != 0) return C_TORN;
    *tcrc = get_le32(t);
    if (icrc && *tcrc != get_le32(icrc)) return C_INDEX_CRC;
    if (!is_zero(t + TRAILER_SIZE, (size_t)(len - tpos - TRAILER_SIZE))) return C_PADDING;
    if (verify) {
        *ccrc = crc_impl(0, f, (size_t)tpos);
        if (*ccrc != *tcrc) return C_CRC;
    }
    return C_OK;
}

typedef struct {
    const uint8_t *buf;
    uint64_t size, base;
    const uint8_t *locs, *gidxs;
    Py_ssize_t n;
    int verify, index_crc;
    uint8_t *status, *crcs, *trailers;
} check_job;

static void check_all(check_job *j) {
    for (Py_ssize_t i = 0; i < j->n; i++) {
        const uint8_t *loc = j->locs + (size_t)i * INDEX_VALUE_SIZE;
        uint64_t off = get_le64(loc + 4), len = get_le32(loc + 12);
        uint32_t tcrc = 0, ccrc = 0, code;
        uint64_t tpos = 0;
        if (off < j->base || len > j->size || off - j->base > j->size - len) {
            code = C_TRUNCATED;
        } else {
            const uint8_t *f = j->buf + (off - j->base);
            code = check_head(f, len, &tpos);
            if (code == C_OK)
                code = check_tail(f, tpos, len, j->gidxs ? j->gidxs + (size_t)i * 8 : NULL,
                                  j->index_crc ? loc + 16 : NULL, j->verify, &tcrc, &ccrc);
        }
        j->status[i] = (uint8_t)code;
        put_le32(j->crcs + (size_t)i * 4, ccrc);
        put_le32(j->trailers + (size_t)i * 4, tcrc);
    }
}

/* ---- gather_frames ----------------------------------------------------------------- */

/* Result codes: the C_* codes above (C_DIFFERS for a head unlike the template), for the
 * first frame, in the order given, that fails a check. */

typedef struct {
    const uint8_t *base;
    uint64_t size;
    const uint8_t *locs, *gidxs, *rows;
    Py_ssize_t n;
    const uint8_t *pre, *rest;
    size_t rest_len;
    uint64_t pstart, plen, flen;
    uint8_t *out;
    int verify;
    /* result */
    Py_ssize_t bad;
    int code;
    uint64_t expected, actual;
} gather_job;

static void gather_all(gather_job *j) {
    const uint64_t tpos = j->pstart + j->plen;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        const uint8_t *loc = j->locs + (size_t)i * INDEX_VALUE_SIZE;
        uint64_t off = get_le64(loc + 4);
        uint32_t len = get_le32(loc + 12);
        int code = C_OK;
        uint64_t exp = 0, act = 0;
        if ((uint64_t)len != j->flen) {
            code = C_DIFFERS;
        } else if (j->flen > j->size || off > j->size - j->flen) {
            code = C_TRUNCATED;
        } else {
            const uint8_t *f = j->base + off;
            const uint8_t *g = j->gidxs + (size_t)i * 8;
            uint32_t tcrc = 0, ccrc = 0;
            if (memcmp(f, j->pre, PREFIX_SIZE) != 0 ||
                memcmp(f + PREFIX_SIZE + 8, j->rest, j->rest_len) != 0) {
                code = C_DIFFERS;
            } else {
                code = check_tail(f, tpos, j->flen, g, loc + 16, j->verify, &tcrc, &ccrc);
                if (code == C_GIDX) {
                    exp = get_le64(g);
                    act = get_le64(f + PREFIX_SIZE);
                } else if (code == C_INDEX_CRC) {
                    exp = get_le32(loc + 16);
                    act = tcrc;
                } else if (code == C_CRC) {
                    exp = tcrc;
                    act = ccrc;
                }
            }
            if (code == C_OK && j->plen) {
                int64_t r = (int64_t)get_le64(j->rows + (size_t)i * 8);
                memcpy(j->out + (uint64_t)r * j->plen, f + j->pstart, (size_t)j->plen);
            }
        }
        if (code != C_OK) {
            j->bad = i;
            j->code = code;
            j->expected = exp;
            j->actual = act;
            return;
        }
    }
}

/* Acquire a C-contiguous buffer (BufferError otherwise), writable when asked (TypeError). */
static int get_contig(PyObject *o, Py_buffer *view, const char *what, int writable) {
    if (PyObject_GetBuffer(o, view, PyBUF_FULL_RO) < 0) return -1;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_BufferError, "%s is not C-contiguous", what);
        return -1;
    }
    if (writable && view->readonly) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a writable buffer", what);
        return -1;
    }
    return 0;
}

static PyObject *py_gather_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
    static const char *const names[] = {"buf",         "locs", "gidxs", "template", "payload_start",
                                        "payload_len", "out",  "rows",  "verify"};
    PyObject *a[9];
    if (parse_args("gather_frames", args, nargs, kwnames, names, 8, 9, a) < 0) return NULL;
    Py_buffer vb = {0}, vl = {0}, vg = {0}, vo = {0}, vr = {0};
    PyObject *pre = NULL, *rest = NULL, *tseq = NULL, *result = NULL;
    gather_job j;
    memset(&j, 0, sizeof(j));
    uint64_t pstart, plen;
    int verify = 1;

    if (!(tseq = PySequence_Fast(a[3], "template must be a (prefix, rest) pair"))) goto done;
    if (PySequence_Fast_GET_SIZE(tseq) != 2) {
        PyErr_SetString(PyExc_ValueError, "template must be a (prefix, rest) pair");
        goto done;
    }
    if (!(pre = as_bytes(PySequence_Fast_GET_ITEM(tseq, 0)))) goto done;
    if (!(rest = as_bytes(PySequence_Fast_GET_ITEM(tseq, 1)))) goto done;
    if (as_uint(a[4], 64, "payload_start", &pstart) < 0 || as_uint(a[5], 64, "payload_len", &plen) < 0) goto done;
    if (a[8] && (verify = PyObject_IsTrue(a[8])) < 0) goto done;
    if (PyBytes_GET_SIZE(pre) != PREFIX_SIZE ||
        (uint64_t)PyBytes_GET_SIZE(pre) + 8 + (uint64_t)PyBytes_GET_SIZE(rest) != pstart) {
        PyErr_SetString(PyExc_ValueError, "template does not match payload_start");
        goto done;
    }
    if (plen > (uint64_t)1 << 62) {
        PyErr_SetString(PyExc_OverflowError, "payload_len too large");
        goto done;
    }
    if (get_contig(a[0], &vb, "buf", 0) < 0) goto done;
    if (get_contig(a[1], &vl, "locs", 0) < 0) goto done;
    if (get_contig(a[2], &vg, "gidxs", 0) < 0) goto done;
    if (get_contig(a[6], &vo, "out", 1) < 0) goto done;
    if (get_contig(a[7], &vr, "rows", 0) < 0) goto done;
    if (vl.len % INDEX_VALUE_SIZE) {
        PyErr_Format(PyExc_ValueError, "locs holds %zd bytes, not a whole number of %d-byte index values", vl.len,
                     INDEX_VALUE_SIZE);
        goto done;
    }
    j.n = vl.len / INDEX_VALUE_SIZE;
    if (vg.len != j.n * 8 || vr.len != j.n * 8) {
        PyErr_SetString(PyExc_ValueError, "gidxs and rows must hold one 8-byte integer per index value");
        goto done;
    }
    if (plen) {
        if ((uint64_t)vo.len % plen) {
            PyErr_SetString(PyExc_ValueError, "out is not a whole number of payload_len rows");
            goto done;
        }
        uint64_t nrows = (uint64_t)vo.len / plen;
        const uint8_t *rp = (const uint8_t *)vr.buf;
        for (Py_ssize_t i = 0; i < j.n; i++) {
            int64_t r = (int64_t)get_le64(rp + (size_t)i * 8);
            if (r < 0 || (uint64_t)r >= nrows) {
                PyErr_SetString(PyExc_IndexError, "row index out of range of out");
                goto done;
            }
        }
    }
    j.base = (const uint8_t *)vb.buf;
    j.size = (uint64_t)vb.len;
    j.locs = (const uint8_t *)vl.buf;
    j.gidxs = (const uint8_t *)vg.buf;
    j.rows = (const uint8_t *)vr.buf;
    j.pre = (const uint8_t *)PyBytes_AS_STRING(pre);
    j.rest = (const uint8_t *)PyBytes_AS_STRING(rest);
    j.rest_len = (size_t)PyBytes_GET_SIZE(rest);
    j.pstart = pstart;
    j.plen = plen;
    j.flen = align_up(pstart + plen + TRAILER_SIZE);
    j.out = (uint8_t *)vo.buf;
    j.verify = verify;
    j.bad = -1;
    if ((uint64_t)j.n * j.flen >= NOGIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS gather_all(&j);
        Py_END_ALLOW_THREADS
    } else {
        gather_all(&j);
    }
    result = Py_BuildValue("(inKK)", j.code, j.bad, (unsigned long long)j.expected, (unsigned long long)j.actual);

done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vg.obj) PyBuffer_Release(&vg);
    if (vo.obj) PyBuffer_Release(&vo);
    if (vr.obj) PyBuffer_Release(&vr);
    Py_XDECREF(pre);
    Py_XDECREF(rest);
    Py_XDECREF(tseq);
    return result;
}

static PyObject *py_check_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static const char *const names[] = {"buf", "locs", "gidxs", "verify", "index_crc", "base"};
    PyObject *a[6];
    if (parse_args("check_frames", args, nargs, kwnames, names, 2, 6, a) < 0) return NULL;
    Py_buffer vb = {0}, vl = {0}, vg = {0};
    PyObject *st = NULL, *cr = NULL, *tr = NULL, *result = NULL;
    check_job j;
    memset(&j, 0, sizeof(j));
    int verify = 1, index_crc = 1;
    uint64_t base = 0;
    if (a[3] && (verify = PyObject_IsTrue(a[3])) < 0) return NULL;
    if (a[4] && (index_crc = PyObject_IsTrue(a[4])) < 0) return NULL;
    if (a[5] && as_uint(a[5], 64, "base", &base) < 0) return NULL;
    if (get_contig(a[0], &vb, "buf", 0) < 0) goto done;
    if (get_contig(a[1], &vl, "locs", 0) < 0) goto done;
    if (a[2] && a[2] != Py_None && get_contig(a[2], &vg, "gidxs", 0) < 0) goto done;
    if (vl.len % INDEX_VALUE_SIZE) {
        PyErr_Format(PyExc_ValueError, "locs holds %zd bytes, not a whole number of %d-byte index values", vl.len,
                     INDEX_VALUE_SIZE);
        goto done;
    }
    j.n = vl.len / INDEX_VALUE_SIZE;
    if (vg.obj && vg.len != j.n * 8) {
        PyErr_SetString(PyExc_ValueError, "gidxs must hold one 8-byte integer per index value");
        goto done;
    }
    if (!(st = PyBytes_FromStringAndSize(NULL, j.n)) || !(cr = PyBytes_FromStringAndSize(NULL, 4 * j.n)) ||
        !(tr = PyBytes_FromStringAndSize(NULL, 4 * j.n)))
        goto done;
    j.buf = (const uint8_t *)vb.buf;
    j.size = (uint64_t)vb.len;
    j.base = base;
    j.locs = (const uint8_t *)vl.buf;
    j.gidxs = vg.obj ? (const uint8_t *)vg.buf : NULL;
    j.verify = verify;
    j.index_crc = index_crc;
    j.status = (uint8_t *)PyBytes_AS_STRING(st);
    j.crcs = (uint8_t *)PyBytes_AS_STRING(cr);
    j.trailers = (uint8_t *)PyBytes_AS_STRING(tr);
    uint64_t work = 0;
    for (Py_ssize_t i = 0; i < j.n && work < NOGIL_THRESHOLD; i++)
        work += 64 + get_le32(j.locs + (size_t)i * INDEX_VALUE_SIZE + 12);
    if (work >= NOGIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS check_all(&j);
        Py_END_ALLOW_THREADS
    } else {
        check_all(&j);
    }
    result = PyTuple_Pack(3, st, cr, tr);

done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vg.obj) PyBuffer_Release(&vg);
    Py_XDECREF(st);
    Py_XDECREF(cr);
    Py_XDECREF(tr);
    return result;
}

/* ---- copy_ranges / restamp_frames -------------------------------------------------- */

/* The n little-endian i64 values of an integer array argument (a buffer of 8n bytes). */
static int get_i64s(PyObject *o, Py_buffer *view, const char *what, Py_ssize_t *n) {
    if (get_contig(o, view, what, 0) < 0) return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must hold 8-byte integers", what);
        return -1;
    }
    *n = view->len / 8;
    return 0;
}

/* The frames at offsets `po` / lengths `pl` (n little-endian i64 each) lie inside `buf` of
 * `size` bytes and their prefixes' lengths fit their extents (frames the frame check passed;
 * their covered bytes end at `align64(24 + H) + P`); else ValueError naming the first one and
 * NULL.  Returns a new array of 3n values (PyMem_Free it): each frame's offset, length and
 * covered length as checked, so that a loop run without the GIL reads those, not the
 * caller's buffers (which another thread may change meanwhile), and stays inside `buf`. */
static uint64_t *checked_extents(const uint8_t *buf, uint64_t size, const uint8_t *po, const uint8_t *pl,
                                 Py_ssize_t n) {
    uint64_t *ext = PyMem_Malloc(sizeof(uint64_t) * 3 * (size_t)(n ? n : 1));
    if (!ext) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t off = get_le64(po + 8 * i), len = get_le64(pl + 8 * i);
        if ((int64_t)off < 0 || (int64_t)len < 0 || off > size || len > size - off ||
            len < PREFIX_SIZE + HEADER_HEAD_SIZE + TRAILER_SIZE) {
            PyErr_Format(PyExc_ValueError, "frame %zd ([%lld, +%lld)) is not inside buf (%llu bytes)", i,
                         (long long)off, (long long)len, (unsigned long long)size);
            PyMem_Free(ext);
            return NULL;
        }
        const uint8_t *f = buf + off;
        uint64_t hlen = get_le16(f + 6), plen = get_le64(f + 8);
        uint64_t pstart = align_up(PREFIX_SIZE + hlen);
        if (hlen < HEADER_HEAD_SIZE || plen > len || pstart + plen + TRAILER_SIZE > len) {
            PyErr_Format(PyExc_ValueError, "frame %zd: its lengths do not fit its extent (not a checked frame)", i);
            PyMem_Free(ext);
            return NULL;
        }
        ext[3 * i] = off;
        ext[3 * i + 1] = len;
        ext[3 * i + 2] = pstart + plen;
    }
    return ext;
}

/* The (offsets, lengths, dst) arguments of copy_ranges and pread_ranges: two int64 arrays of one
 * length n and a writable contiguous buffer.  On failure an exception is set and the views
 * taken so far stay for the caller to release (their .obj is set). */
static int get_ranges(PyObject *const *a, Py_buffer *vo, Py_buffer *vl, Py_buffer *vd, Py_ssize_t *n) {
    Py_ssize_t nl = 0;
    if (get_i64s(a[0], vo, "offsets", n) < 0) return -1;
    if (get_i64s(a[1], vl, "lengths", &nl) < 0) return -1;
    if (get_contig(a[2], vd, "dst", 1) < 0) return -1;
    if (*n != nl) {
        PyErr_SetString(PyExc_ValueError, "offsets and lengths must have the same length");
        return -1;
    }
    return 0;
}

static PyObject *py_copy_ranges(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"src", "offsets", "lengths", "dst"};
    PyObject *a[4];
    if (parse_args("copy_ranges", args, nargs, kwnames, names, 4, 4, a) < 0) return NULL;
    Py_buffer vs = {0}, vo = {0}, vl = {0}, vd = {0};
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    if (get_contig(a[0], &vs, "src", 0) < 0) goto done;
    if (get_ranges(a + 1, &vo, &vl, &vd, &n) < 0) goto done;
    const uint8_t *po = (const uint8_t *)vo.buf, *pl = (const uint8_t *)vl.buf;
    uint64_t total = 0, size = (uint64_t)vs.len;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t off = get_le64(po + 8 * i), len = get_le64(pl + 8 * i);
        if ((int64_t)off < 0 || (int64_t)len < 0 || off > size || len > size - off) {
            PyErr_Format(PyExc_ValueError, "range %zd ([%lld, +%lld)) is not inside src (%llu bytes)", i,
                         (long long)off, (long long)len, (unsigned long long)size);
            goto done;
        }
        total += len;
    }
    if (total > (uint64_t)vd.len) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, the ranges %llu", vd.len, (unsigned long long)total);
        goto done;
    }
    {
        const uint8_t *src = (const uint8_t *)vs.buf;
        uint8_t *dst = (uint8_t *)vd.buf;
        Py_BEGIN_ALLOW_THREADS
        uint64_t pos = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t off = get_le64(po + 8 * i), len = get_le64(pl + 8 * i);
            memcpy(dst + pos, src + off, (size_t)len);
            pos += len;
        }
        Py_END_ALLOW_THREADS
    }
    result = PyLong_FromUnsignedLongLong(total);
done:
    if (vs.obj) PyBuffer_Release(&vs);
    if (vo.obj) PyBuffer_Release(&vo);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vd.obj) PyBuffer_Release(&vd);
    return result;
}

static PyObject *py_restamp_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buf", "offsets", "lengths", "gidxs"};
    PyObject *a[4];
    if (parse_args("restamp_frames", args, nargs, kwnames, names, 4, 4, a) < 0) return NULL;
    Py_buffer vb = {0}, vo = {0}, vl = {0}, vg = {0};
    PyObject *crcs = NULL, *result = NULL;
    uint64_t *ext = NULL;
    Py_ssize_t n = 0, nl = 0, ng = 0;
    if (get_contig(a[0], &vb, "buf", 1) < 0) goto done;
    if (get_i64s(a[1], &vo, "offsets", &n) < 0) goto done;
    if (get_i64s(a[2], &vl, "lengths", &nl) < 0) goto done;
    if (get_i64s(a[3], &vg, "gidxs", &ng) < 0) goto done;
    if (n != nl || n != ng) {
        PyErr_SetString(PyExc_ValueError, "offsets, lengths and gidxs must have the same length");
        goto done;
    }
    const uint8_t *po = (const uint8_t *)vo.buf, *pl = (const uint8_t *)vl.buf, *pg = (const uint8_t *)vg.buf;
    uint8_t *buf = (uint8_t *)vb.buf;
    uint64_t size = (uint64_t)vb.len, work = 0;
    if (!(ext = checked_extents(buf, size, po, pl, n))) goto done; /* nothing changes on an error */
    work = 64 * (uint64_t)n;
    if (!(crcs = PyBytes_FromStringAndSize(NULL, 4 * n))) goto done;
    {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(crcs);
        int nogil = work >= NOGIL_THRESHOLD;
        PyThreadState *ts = nogil ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint8_t *f = buf + ext[3 * i];
            uint64_t cover = ext[3 * i + 2];
            uint32_t crc = get_le32(f + cover);
            uint8_t delta[8], g[8];
            put_le64(g, get_le64(pg + 8 * i));
            for (int k = 0; k < 8; k++) delta[k] = f[PREFIX_SIZE + k] ^ g[k];
            crc = crc_patch8(crc, delta, PREFIX_SIZE, cover);
            memcpy(f + PREFIX_SIZE, g, 8);
            put_le32(f + cover, crc);
            put_le32(out + 4 * i, crc);
        }
        if (ts) PyEval_RestoreThread(ts);
    }
    result = crcs;
    crcs = NULL;
done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vo.obj) PyBuffer_Release(&vo);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vg.obj) PyBuffer_Release(&vg);
    PyMem_Free(ext);
    Py_XDECREF(crcs);
    return result;
}

/* crc32c_frames: the CRC32C of `value`'s bytes followed by the frames at `offsets`/`lengths`
 * of `buf` back to back, computed from each frame's trailer CRC (the CRC32C of its covered
 * bytes) without reading its covered bytes: the trailer and padding after it are appended to
 * that CRC, and the frame's CRC is combined into the running one (zlib's crc32_combine:
 * shifting the running CRC through the frame's length in O(log length)).  Only for frames
 * that passed the frame check (their trailers hold their covered bytes' CRC32C); the prefix
 * and trailer of each are read.  ValueError (nothing computed) for a frame outside `buf` or
 * whose lengths do not fit its extent. */
static PyObject *py_crc32c_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buf", "offsets", "lengths", "value"};
    PyObject *a[4];
    if (parse_args("crc32c_frames", args, nargs, kwnames, names, 3, 4, a) < 0) return NULL;
    Py_buffer vb = {0}, vo = {0}, vl = {0};
    PyObject *result = NULL;
    uint64_t *ext = NULL;
    Py_ssize_t n = 0, nl = 0;
    uint32_t crc = 0;
    if (a[3]) {
        PyObject *v = PyNumber_Index(a[3]);
        if (!v) return NULL;
        crc = (uint32_t)(PyLong_AsUnsignedLongLongMask(v) & 0xffffffffu);
        Py_DECREF(v);
        if (PyErr_Occurred()) return NULL;
    }
    if (get_contig(a[0], &vb, "buf", 0) < 0) goto done;
    if (get_i64s(a[1], &vo, "offsets", &n) < 0) goto done;
    if (get_i64s(a[2], &vl, "lengths", &nl) < 0) goto done;
    if (n != nl) {
        PyErr_SetString(PyExc_ValueError, "offsets and lengths must have the same length");
        goto done;
    }
    const uint8_t *po = (const uint8_t *)vo.buf, *pl = (const uint8_t *)vl.buf;
    const uint8_t *buf = (const uint8_t *)vb.buf;
    uint64_t size = (uint64_t)vb.len;
    if (!(ext = checked_extents(buf, size, po, pl, n))) goto done;
    {
        PyThreadState *ts = n >= 4096 ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint8_t *f = buf + ext[3 * i];
            uint64_t len = ext[3 * i + 1], cover = ext[3 * i + 2];
            uint32_t fcrc = crc_impl(get_le32(f + cover), f + cover, (size_t)(len - cover));
            crc = multmodp(x2nmodp(len, 3), crc) ^ fcrc;
        }
        if (ts) PyEval_RestoreThread(ts);
    }
    result = PyLong_FromUnsignedLong(crc);
done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vo.obj) PyBuffer_Release(&vo);
    if (vl.obj) PyBuffer_Release(&vl);
    PyMem_Free(ext);
    return result;
}

/* pread_ranges: the byte ranges (i64 offsets, lengths) of the open file `fd` read back to back
 * into `dst`, one pread(2) per range (repeated on a short read), without the GIL: a reader of
 * many small ranges (a unit's frames interleaved with other units' in a source file) pays a
 * system call per range, not a Python call.  Reads only.  Returns the bytes read: fewer than
 * the ranges hold only when the file ends first (the caller names the truncated range). */
static PyObject *py_pread_ranges(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"fd", "offsets", "lengths", "dst"};
    PyObject *a[4];
    if (parse_args("pread_ranges", args, nargs, kwnames, names, 4, 4, a) < 0) return NULL;
    Py_buffer vo = {0}, vl = {0}, vd = {0};
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    int fd = PyObject_AsFileDescriptor(a[0]);
    if (fd < 0) return NULL;
    if (get_ranges(a + 1, &vo, &vl, &vd, &n) < 0) goto done;
    const uint8_t *po = (const uint8_t *)vo.buf, *pl = (const uint8_t *)vl.buf;
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t off = (int64_t)get_le64(po + 8 * i), len = (int64_t)get_le64(pl + 8 * i);
        if (off < 0 || len < 0 || (uint64_t)len > (uint64_t)vd.len - total) {
            PyErr_Format(PyExc_ValueError, "range %zd ([%lld, +%lld)) is negative or past dst (%zd bytes)", i,
                         (long long)off, (long long)len, vd.len);
            goto done;
        }
        total += (uint64_t)len;
    }
    {
        uint8_t *dst = (uint8_t *)vd.buf;
        uint64_t pos = 0;
        int err = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !err; i++) {
            uint64_t off = get_le64(po + 8 * i), left = get_le64(pl + 8 * i);
            while (left) {
                ssize_t r = pread(fd, dst + pos, (size_t)left, (off_t)off);
                if (r < 0) {
                    if (errno == EINTR) continue;
                    err = errno;
                    break;
                }
                if (r == 0) { /* end of file: stop, the caller sees fewer bytes */
                    i = n;
                    break;
                }
                pos += (uint64_t)r;
                off += (uint64_t)r;
                left -= (uint64_t)r;
            }
        }
        Py_END_ALLOW_THREADS
        if (err) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        result = PyLong_FromUnsignedLongLong(pos);
    }
done:
    if (vo.obj) PyBuffer_Release(&vo);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vd.obj) PyBuffer_Release(&vd);
    return result;
}

/* pwrite_ranges: the byte ranges (i64 offsets, lengths) of `src` (say, a mapped segment) written
 * back to back into the open file `fd` from its offset `pos`, with vectored writes of up to
 * 1024 ranges (repeated on a short write), without the GIL: a shard of many small frames costs
 * a system call per 1024 frames, not a Python call and a memoryview per frame.  `writeback` > 0:
 * every time that many more bytes are written, their writeback is started
 * (posix_fadvise(DONTNEED): it starts the writeback without waiting and drops clean pages), so
 * a later fsync finds little left; a hint, its errors are ignored.  Every range is checked to
 * lie inside `src` before anything is written (ValueError).  Returns the bytes written; OSError
 * for a failed write (some ranges may be written). */
#define PWRITE_IOV 1024
static PyObject *py_pwrite_ranges(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"fd", "src", "offsets", "lengths", "pos", "writeback"};
    PyObject *a[6];
    if (parse_args("pwrite_ranges", args, nargs, kwnames, names, 6, 6, a) < 0) return NULL;
    Py_buffer vs = {0}, vo = {0}, vl = {0};
    PyObject *result = NULL;
    Py_ssize_t n = 0, nl = 0;
    int fd = PyObject_AsFileDescriptor(a[0]);
    if (fd < 0) return NULL;
    long long pos0 = PyLong_AsLongLong(a[4]);
    if (pos0 == -1 && PyErr_Occurred()) return NULL;
    long long wb = PyLong_AsLongLong(a[5]);
    if (wb == -1 && PyErr_Occurred()) return NULL;
    if (pos0 < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must not be negative");
        return NULL;
    }
    if (get_contig(a[1], &vs, "src", 0) < 0) goto done;
    if (get_i64s(a[2], &vo, "offsets", &n) < 0) goto done;
    if (get_i64s(a[3], &vl, "lengths", &nl) < 0) goto done;
    if (n != nl) {
        PyErr_SetString(PyExc_ValueError, "offsets and lengths must have the same length");
        goto done;
    }
    const uint8_t *po = (const uint8_t *)vo.buf, *pl = (const uint8_t *)vl.buf;
    uint64_t size = (uint64_t)vs.len;
    uint64_t *rng = PyMem_Malloc(sizeof(uint64_t) * 2 * (size_t)(n ? n : 1));
    if (!rng) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* copied as checked: the loop below reads these */
        uint64_t off = get_le64(po + 8 * i), len = get_le64(pl + 8 * i);
        if ((int64_t)off < 0 || (int64_t)len < 0 || off > size || len > size - off) {
            PyErr_Format(PyExc_ValueError, "range %zd ([%lld, +%lld)) is not inside src (%llu bytes)", i,
                         (long long)off, (long long)len, (unsigned long long)size);
            PyMem_Free(rng);
            goto done;
        }
        rng[2 * i] = off;
        rng[2 * i + 1] = len;
    }
    {
        const uint8_t *src = (const uint8_t *)vs.buf;
        uint64_t pos = (uint64_t)pos0, mark = (uint64_t)pos0;
        int err = 0;
        Py_BEGIN_ALLOW_THREADS
        struct iovec iov[PWRITE_IOV];
        Py_ssize_t i = 0;
        uint64_t skip = 0; /* bytes of range i written by a short write */
        while (i < n && !err) {
            int k = 0;
            Py_ssize_t j = i;
            for (; j < n && k < PWRITE_IOV; j++) {
                uint64_t off = rng[2 * j] + (j == i ? skip : 0), len = rng[2 * j + 1] - (j == i ? skip : 0);
                if (!len) continue;
                iov[k].iov_base = (void *)(src + off);
                iov[k].iov_len = (size_t)len;
                k++;
            }
            if (!k) break;
            ssize_t w = pwritev(fd, iov, k, (off_t)pos);
            if (w < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            if (w == 0) {
                err = EIO;
                break;
            }
            pos += (uint64_t)w;
            uint64_t left = (uint64_t)w; /* advance past what was written */
            while (left && i < n) {
                uint64_t rest = rng[2 * i + 1] - skip;
                if (left >= rest) {
                    left -= rest;
                    i++;
                    skip = 0;
                } else {
                    skip += left;
                    left = 0;
                }
            }
            while (i < n && rng[2 * i + 1] == skip) { /* empty ranges */
                i++;
                skip = 0;
            }
            if (wb > 0 && pos - mark >= (uint64_t)wb) {
                (void)posix_fadvise(fd, (off_t)mark, (off_t)(pos - mark), POSIX_FADV_DONTNEED);
                mark = pos;
            }
        }
        Py_END_ALLOW_THREADS
        PyMem_Free(rng);
        if (err) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        result = PyLong_FromUnsignedLongLong(pos - (uint64_t)pos0);
    }
done:
    if (vs.obj) PyBuffer_Release(&vs);
    if (vo.obj) PyBuffer_Release(&vo);
    if (vl.obj) PyBuffer_Release(&vl);
    return result;
}

/* ---- leaf_columns: the leaf level of an LMDB B+tree ---------------------------------- */

/* LMDB 0.9, 64-bit (lmdb/libraries/liblmdb/mdb.c; tqstore/_format/lmdb_pages.py): a page
 * starts with pgno u64, pad u16, flags u16, lower u16, upper u16, then (lower - 16) / 2 node
 * offsets u16; a node is lo u16, hi u16 (data size lo | hi << 16), flags u16, key size u16,
 * the key, then the data inline or (F_BIGDATA) the u64 number of its first overflow page. */
#define MDB_PAGEHDRSZ 16
#define MDB_NODESZ 8
#define MDB_P_LEAF 0x02
#define MDB_F_BIGDATA 0x01
#define LEAF_AHEAD 4
#define LEAF_BIG_ROW 24 /* a `big` row: node index, position in values, overflow page (i64 each) */

/* The failures (the _pure twin's codes and messages are the same). */
enum {
    LEAF_OK,
    LEAF_OUTSIDE, /* a page's header, */
    LEAF_TWICE,
    LEAF_KIND,
    LEAF_NUMBER,
    LEAF_AREA,
    LEAF_NODE_OFFSET, /* a node, */
    LEAF_NODE_FLAGS,
    LEAF_NODE_END,
    LEAF_NODES_SIZE, /* a page's nodes together */
    LEAF_CHANGED,    /* the buffer, between the two passes */
    LEAF_NOMEM,
};
static const char *const leaf_what[] = {
    "",
    "a page number outside the file",
    "a page named twice in the tree",
    "a page of another kind than the tree's level",
    "a page that is not the page its number names",
    "a page's node area is malformed",
    "a node offset outside its page",
    "a node of unexpected flags",
    "a node past the end of its page",
    "nodes of more bytes than the page's node area",
    "the pages changed while they were read",
    "",
};

typedef struct {
    const uint8_t *buf;
    uint64_t psize, npages;
    const uint8_t *pgnos; /* nleaf little-endian i64: the leaf pages in tree order */
    Py_ssize_t nleaf;
    unsigned allowed; /* the flags a node may have */
    uint8_t *seen;    /* one bit per page of the buffer: a page named twice */
    /* the headers' pass: the nodes, and a bound on their key (or inline value) bytes */
    uint64_t nodes, room;
    /* the nodes' pass: the caller's outputs (keys and values of key_cap and value_cap >= room
     * bytes, the arrays of `nodes` entries), the big rows (grown as met), how far each is filled */
    uint8_t *keys, *key_lens, *values, *value_lens, *flags, *big;
    uint64_t key_cap, value_cap, big_cap, at_node, at_key, at_value, at_big;
    /* the first failure: its LEAF_* code, leaf (index into pgnos) and node (-1: the page) */
    int err;
    Py_ssize_t err_leaf;
    long long err_node;
} leaf_job;

static inline int64_t leaf_pgno(const leaf_job *j, Py_ssize_t i) {
    return (int64_t)get_le64(j->pgnos + 8 * (uint64_t)i);
}

static inline void leaf_fail(leaf_job *j, int err, Py_ssize_t leaf, long long node) {
    j->err = err;
    j->err_leaf = leaf;
    j->err_node = node;
}

/* A page's node offsets end at lower, its nodes lie side by side from upper to the page's end:
 * 16 <= lower (even) <= upper <= the page size, and the node area holds the nodes' 8-byte
 * headers at least (which bounds the node count by the area, before any node is read), else
 * the area is malformed (0). */
static inline int leaf_area_ok(unsigned lower, unsigned upper, uint64_t psize) {
    return lower >= MDB_PAGEHDRSZ && !(lower & 1) && upper <= psize && lower <= upper &&
           (uint64_t)(lower - MDB_PAGEHDRSZ) / 2 * MDB_NODESZ <= psize - upper;
}

/* The header checks of leaf page `pg` (as lmdb_pages' _pages, and each page once): LEAF_OK
 * and the page's lower and upper bounds, or the failure. */
static int leaf_header(leaf_job *j, int64_t pg, unsigned *lower, unsigned *upper) {
    if (pg < 2 || (uint64_t)pg >= j->npages) return LEAF_OUTSIDE;
    uint8_t bit = (uint8_t)(1u << (pg & 7));
    if (j->seen[pg >> 3] & bit) return LEAF_TWICE;
    j->seen[pg >> 3] |= bit;
    const uint8_t *p = j->buf + (uint64_t)pg * j->psize;
    if (get_le16(p + 10) != MDB_P_LEAF) return LEAF_KIND; /* exactly: LMDB refuses a leaf with P_DIRTY too */
    if (get_le64(p) != (uint64_t)pg) return LEAF_NUMBER;
    *lower = get_le16(p + 12);
    *upper = get_le16(p + 14);
    return leaf_area_ok(*lower, *upper, j->psize) ? LEAF_OK : LEAF_AREA;
}

/* First pass, over the page headers only: each checked, the nodes counted and the bytes of
 * their keys (or of their inline values) bounded by the pages' node areas less the nodes'
 * 8-byte headers (the second pass checks that the nodes fit), so that the outputs can be
 * allocated before the single pass over the nodes.  Each page counts once: the node count is
 * at most a tenth of the buffer's size, the room at most its size.  (Run again by
 * leaf_columns: it trusts nothing of leaf_room's.) */
static void leaf_headers(leaf_job *j) {
    for (Py_ssize_t i = 0; i < j->nleaf; i++) {
        unsigned lower = 0, upper = 0;
        int e = leaf_header(j, leaf_pgno(j, i), &lower, &upper);
        if (e != LEAF_OK) {
            leaf_fail(j, e, i, -1);
            return;
        }
        uint64_t n = (lower - MDB_PAGEHDRSZ) / 2;
        j->nodes += n;
        j->room += j->psize - upper - MDB_NODESZ * n; /* (>= 0: the area is checked) */
    }
}

/* n bytes from src (src_room bytes to the end of its buffer) to dst (dst_room bytes to the
 * end of its): one fixed 32-byte copy when n <= 32 and both sides have the 32 bytes (most
 * keys and values: a few moves instead of a memcpy call); the bytes past n are overwritten
 * by the next entry or lie past the output's final size. */
static inline void copy_short(uint8_t *dst, uint64_t dst_room, const uint8_t *src, uint64_t src_room, uint64_t n) {
    if (n <= 32 && dst_room >= 32 && src_room >= 32)
        memcpy(dst, src, 32);
    else
        memcpy(dst, src, (size_t)n);
}

/* Node `i`'s row of the big output (node index, position in values, first overflow page),
 * the rows grown as met (F_BIGDATA nodes are rare); 0 when out of memory. */
static int leaf_big_row(leaf_job *j, uint64_t i, uint64_t at_value, uint64_t over) {
    if (j->at_big == j->big_cap) {
        uint64_t cap = 2 * j->big_cap + 64;
        uint8_t *grown = PyMem_RawRealloc(j->big, (size_t)(cap * LEAF_BIG_ROW));
        if (!grown) return 0;
        j->big = grown;
        j->big_cap = cap;
    }
    uint8_t *row = j->big + LEAF_BIG_ROW * j->at_big++;
    put_le64(row, i);
    put_le64(row + 8, at_value);
    put_le64(row + 16, over);
    return 1;
}

/* The nodes of leaf page `p` (its area checked) in order, each checked (as lmdb_pages'
 * _nodes and _entries: offset, flags, extent) and copied out, then their bytes against the
 * page's node area.  LEAF_OK, or the failure and its node in *k (-1: the page's).  The
 * cursors are locals while the page is walked (the byte stores could alias the job), and
 * the nodes a few ahead are prefetched: the walk waits on memory, not on arithmetic. */
static int leaf_nodes(leaf_job *j, const uint8_t *p, unsigned lower, unsigned upper, long long *k) {
    const uint8_t *end = j->buf + j->npages * j->psize;
    uint8_t *keys = j->keys, *values = j->values, *key_lens = j->key_lens, *value_lens = j->value_lens,
            *flag_out = j->flags;
    uint64_t n = (lower - MDB_PAGEHDRSZ) / 2, psize = j->psize, span = 0, nodes = j->nodes;
    uint64_t key_cap = j->key_cap, value_cap = j->value_cap;
    uint64_t at_node = j->at_node, at_key = j->at_key, at_value = j->at_value;
    unsigned allowed = j->allowed;
    int e = LEAF_OK, fits = 1;
    uint64_t i;
    for (i = 0; i < n; i++) {
        uint64_t at = get_le16(p + MDB_PAGEHDRSZ + 2 * i);
        if (i + LEAF_AHEAD < n) /* (the offset read lies before lower; a prefetch may point anywhere) */
            __builtin_prefetch(p + get_le16(p + MDB_PAGEHDRSZ + 2 * (i + LEAF_AHEAD)));
        if (at < MDB_PAGEHDRSZ || at + MDB_NODESZ > psize || (at & 1)) {
            e = LEAF_NODE_OFFSET;
            break;
        }
        const uint8_t *node = p + at, *key = node + MDB_NODESZ;
        uint64_t dsize = get_le32(node), ksize = get_le16(node + 6);
        unsigned flags = get_le16(node + 4);
        if (flags & ~allowed) {
            e = LEAF_NODE_FLAGS;
            break;
        }
        int big = flags & MDB_F_BIGDATA;
        uint64_t size = MDB_NODESZ + ksize + (big ? 8 : dsize), inl = big ? 0 : dsize; /* < 2**33 */
        if (size > psize - at) {
            e = LEAF_NODE_END;
            break;
        }
        span += size;
        /* past the room (more bytes than the node area: the page fails below) the checks go on */
        fits = fits && at_node < nodes && ksize <= key_cap - at_key && inl <= value_cap - at_value;
        if (fits) {
            copy_short(keys + at_key, key_cap - at_key, key, (uint64_t)(end - key), ksize);
            copy_short(values + at_value, value_cap - at_value, key + ksize, (uint64_t)(end - key - ksize), inl);
            put_le64(key_lens + 8 * at_node, ksize);
            put_le64(value_lens + 8 * at_node, dsize);
            put_le16(flag_out + 2 * at_node, (uint16_t)flags);
            if (big && !leaf_big_row(j, at_node, at_value, get_le64(key + ksize))) {
                e = LEAF_NOMEM;
                break;
            }
        }
        at_node++;
        at_key += ksize;
        at_value += inl;
    }
    j->at_node = at_node;
    j->at_key = at_key;
    j->at_value = at_value;
    *k = (long long)i;
    if (e != LEAF_OK) return e;
    /* LMDB lays a page's nodes side by side from upper to the page's end: more bytes than
     * that is corruption (nodes overlapping), and the bound the outputs were sized by. */
    *k = -1;
    if (span > psize - upper) return LEAF_NODES_SIZE;
    return fits ? LEAF_OK : LEAF_CHANGED;
}

/* The header lines and the end (where the nodes start) of page `pg`, if in the buffer. */
static inline void leaf_prefetch_page(const leaf_job *j, int64_t pg) {
    if (pg < 2 || (uint64_t)pg >= j->npages) return;
    const uint8_t *q = j->buf + (uint64_t)pg * j->psize;
    __builtin_prefetch(q);
    __builtin_prefetch(q + 64);
    __builtin_prefetch(q + j->psize - 64);
    __builtin_prefetch(q + j->psize - 128);
}

/* Second pass: every page's nodes, checked and copied out.  Its header is read again and
 * checked as far as the reads depend on it: the buffer may have changed since the first
 * pass (another thread, a shared map of a file written to), which only raises. */
static void leaf_pages_nodes(leaf_job *j) {
    for (Py_ssize_t i = 0; i < j->nleaf; i++) {
        int64_t pg = leaf_pgno(j, i);
        long long k = -1;
        if (i + 1 < j->nleaf) leaf_prefetch_page(j, leaf_pgno(j, i + 1));
        if (pg < 2 || (uint64_t)pg >= j->npages) {
            leaf_fail(j, LEAF_CHANGED, i, -1);
            return;
        }
        const uint8_t *p = j->buf + (uint64_t)pg * j->psize;
        unsigned lower = get_le16(p + 12), upper = get_le16(p + 14);
        if (!leaf_area_ok(lower, upper, j->psize)) {
            leaf_fail(j, LEAF_CHANGED, i, -1);
            return;
        }
        int e = leaf_nodes(j, p, lower, upper, &k);
        if (e != LEAF_OK) {
            leaf_fail(j, e, i, k);
            return;
        }
    }
    if (j->at_node != j->nodes) leaf_fail(j, LEAF_CHANGED, 0, -1);
}

static void leaf_raise(const leaf_job *j) {
    const char *what = leaf_what[j->err];
    if (j->err == LEAF_NOMEM) {
        PyErr_NoMemory();
    } else if (j->err == LEAF_CHANGED) {
        PyErr_SetString(PyExc_ValueError, what);
    } else if (j->err_node < 0) {
        PyErr_Format(PyExc_ValueError, "leaf %zd (page %lld): %s", j->err_leaf, (long long)leaf_pgno(j, j->err_leaf),
                     what);
    } else {
        PyErr_Format(PyExc_ValueError, "leaf %zd (page %lld) node %lld: %s", j->err_leaf,
                     (long long)leaf_pgno(j, j->err_leaf), j->err_node, what);
    }
}

/* One pass, without the GIL when the pages hold >= NOGIL_THRESHOLD bytes. */
static void leaf_pass(leaf_job *j, void (*pass)(leaf_job *)) {
    if ((uint64_t)j->nleaf >= NOGIL_THRESHOLD / j->psize) {
        Py_BEGIN_ALLOW_THREADS pass(j);
        Py_END_ALLOW_THREADS
    } else {
        pass(j);
    }
}

/* The (buf, pgnos, page_size) arguments into `j`, the headers' pass run; 0 with an exception
 * set.  The views are the caller's to release (their .obj is set). */
static int leaf_begin(PyObject *const *a, Py_buffer *vb, Py_buffer *vp, leaf_job *j) {
    uint64_t psize = 0;
    if (get_contig(a[0], vb, "buf", 0) < 0) return 0;
    if (get_i64s(a[1], vp, "pgnos", &j->nleaf) < 0) return 0;
    if (as_uint(a[2], 64, "page_size", &psize) < 0) return 0;
    if (psize < 512 || psize > ((uint64_t)1 << 31) || (psize & (psize - 1))) {
        PyErr_Format(PyExc_ValueError, "page_size must be a power of two in [512, 2**31], got %llu",
                     (unsigned long long)psize);
        return 0;
    }
    j->buf = (const uint8_t *)vb->buf;
    j->psize = psize;
    j->npages = (uint64_t)vb->len / psize;
    j->pgnos = (const uint8_t *)vp->buf;
    return 1;
}

/* The headers' pass over the pages of `j`; 0 with an exception set. */
static int leaf_check_headers(leaf_job *j) {
    if (!(j->seen = PyMem_RawCalloc((size_t)(j->npages / 8 + 1), 1))) {
        PyErr_NoMemory();
        return 0;
    }
    leaf_pass(j, leaf_headers);
    if (j->err) leaf_raise(j);
    return !j->err;
}

/* leaf_room(buf, pgnos, page_size): (nodes, room) of the leaf pages `pgnos` (their headers
 * checked as leaf_columns checks them): the sizes of leaf_columns' outputs. */
static PyObject *py_leaf_room(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buf", "pgnos", "page_size"};
    PyObject *a[3], *result = NULL;
    if (parse_args("leaf_room", args, nargs, kwnames, names, 3, 3, a) < 0) return NULL;
    Py_buffer vb = {0}, vp = {0};
    leaf_job j;
    memset(&j, 0, sizeof(j));
    if (leaf_begin(a, &vb, &vp, &j) && leaf_check_headers(&j))
        result = Py_BuildValue("(KK)", (unsigned long long)j.nodes, (unsigned long long)j.room);
    if (vb.obj) PyBuffer_Release(&vb);
    if (vp.obj) PyBuffer_Release(&vp);
    PyMem_RawFree(j.seen);
    return result;
}

/* The outputs (views vo[0..4]: keys, key_lens, values, value_lens, flags) against the sizes of
 * the headers' pass, in argument order; 0 with ValueError set. */
static int leaf_outputs(leaf_job *j, Py_buffer *vo) {
    static const char *const what[5] = {"keys", "key_lens", "values", "value_lens", "flags"};
    uint64_t need[5] = {j->room, 8 * j->nodes, j->room, 8 * j->nodes, 2 * j->nodes}; /* <= the buffer's size */
    for (int i = 0; i < 5; i++) {
        if ((uint64_t)vo[i].len < need[i]) {
            PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, the pages need %llu", what[i], vo[i].len,
                         (unsigned long long)need[i]);
            return 0;
        }
    }
    j->keys = (uint8_t *)vo[0].buf;
    j->key_lens = (uint8_t *)vo[1].buf;
    j->values = (uint8_t *)vo[2].buf;
    j->value_lens = (uint8_t *)vo[3].buf;
    j->flags = (uint8_t *)vo[4].buf;
    j->key_cap = (uint64_t)vo[0].len;
    j->value_cap = (uint64_t)vo[2].len;
    return 1;
}

/* leaf_columns(buf, pgnos, page_size, allowed_flags, keys, key_lens, values, value_lens, flags):
 * the entries of an LMDB database's leaf pages `pgnos` (i64, in tree order) of the data file
 * `buf` into the caller's outputs (sized by leaf_room), every page and node checked (see
 * _pure.leaf_columns, the reference), in two passes without the GIL (on more than a few
 * pages): the page headers (checks, counts), then the nodes (checks, copies).  Returns
 * (key bytes, value bytes, big rows). */
static PyObject *py_leaf_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buf",  "pgnos",    "page_size",  "allowed_flags", "keys",
                                        "key_lens", "values", "value_lens", "flags"};
    static const char *const out_names[] = {"keys", "key_lens", "values", "value_lens", "flags"};
    PyObject *a[9], *result = NULL;
    if (parse_args("leaf_columns", args, nargs, kwnames, names, 9, 9, a) < 0) return NULL;
    Py_buffer vb = {0}, vp = {0}, vo[5] = {{0}};
    leaf_job j;
    memset(&j, 0, sizeof(j));
    uint64_t allowed = 0;
    if (!leaf_begin(a, &vb, &vp, &j)) goto done;
    if (as_uint(a[3], 16, "allowed_flags", &allowed) < 0) goto done;
    j.allowed = (unsigned)allowed;
    for (int i = 0; i < 5; i++)
        if (get_contig(a[4 + i], &vo[i], out_names[i], 1) < 0) goto done;
    if (!leaf_check_headers(&j) || !leaf_outputs(&j, vo)) goto done;
    leaf_pass(&j, leaf_pages_nodes);
    if (j.err) {
        leaf_raise(&j);
        goto done;
    }
    PyObject *big = j.at_big ? PyBytes_FromStringAndSize((const char *)j.big, (Py_ssize_t)(LEAF_BIG_ROW * j.at_big))
                             : PyBytes_FromStringAndSize(NULL, 0);
    if (big) result = Py_BuildValue("(KKN)", (unsigned long long)j.at_key, (unsigned long long)j.at_value, big);
done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vp.obj) PyBuffer_Release(&vp);
    for (int i = 0; i < 5; i++)
        if (vo[i].obj) PyBuffer_Release(&vo[i]);
    PyMem_RawFree(j.seen);
    PyMem_RawFree(j.big);
    return result;
}

/* ---- place_keys: the keys of a controller index's ``keys`` entries, decoded in bulk ---- */

/* place_keys(buf, lens, prefix, slots, out) -> (status, i).  The entries of ``buf`` lie back to
 * back (i64 ``lens``); each must be ``prefix`` followed by UTF-8 without NUL, and its text (the
 * prefix cut off) goes to ``out[slots[i]]`` (a list), which must hold None.  Status 0: all
 * placed (i = their number); else entry i is the first that fails and the entries before it are
 * placed: 1 it does not start with ``prefix``, 2 it holds a NUL past it, 3 its slot is out of
 * range or already holds a key, 4 it is not UTF-8.  Raises ValueError when ``lens`` run past
 * ``buf`` or ``slots`` is another length, TypeError when ``out`` is not a list. */
static PyObject *py_place_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buf", "lens", "prefix", "slots", "out"};
    PyObject *a[5];
    if (parse_args("place_keys", args, nargs, kwnames, names, 5, 5, a) < 0) return NULL;
    Py_buffer vb = {0}, vl = {0}, vp = {0}, vs = {0};
    PyObject *result = NULL;
    Py_ssize_t n = 0, ns = 0, i = 0;
    int status = 0;
    if (get_contig(a[0], &vb, "buf", 0) < 0) goto done;
    if (get_i64s(a[1], &vl, "lens", &n) < 0) goto done;
    if (get_contig(a[2], &vp, "prefix", 0) < 0) goto done;
    if (get_i64s(a[3], &vs, "slots", &ns) < 0) goto done;
    if (!PyList_Check(a[4])) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        goto done;
    }
    if (n != ns) {
        PyErr_SetString(PyExc_ValueError, "lens and slots must have the same length");
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)vb.buf, *pl = (const uint8_t *)vl.buf, *ps = (const uint8_t *)vs.buf;
        const uint8_t *prefix = (const uint8_t *)vp.buf;
        uint64_t size = (uint64_t)vb.len, plen = (uint64_t)vp.len, pos = 0;
        PyObject *out = a[4];
        for (i = 0; i < n; i++) {
            uint64_t len = get_le64(pl + 8 * i), slot = get_le64(ps + 8 * i);
            if ((int64_t)len < 0 || len > size - pos) {
                PyErr_Format(PyExc_ValueError, "entry %zd runs past buf (%llu bytes)", i, (unsigned long long)size);
                goto done;
            }
            const uint8_t *e = buf + pos;
            pos += len;
            if (len < plen || memcmp(e, prefix, (size_t)plen) != 0) { status = 1; break; }
            const char *k = (const char *)e + plen;
            Py_ssize_t klen = (Py_ssize_t)(len - plen);
            if (klen && memchr(k, 0, (size_t)klen)) { status = 2; break; }
            if ((int64_t)slot < 0 || slot >= (uint64_t)PyList_GET_SIZE(out) || PyList_GET_ITEM(out, (Py_ssize_t)slot) != Py_None) {
                status = 3;
                break;
            }
            PyObject *str = PyUnicode_DecodeUTF8(k, klen, "strict");
            if (!str) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto done;
                PyErr_Clear();
                status = 4;
                break;
            }
            PyList_SetItem(out, (Py_ssize_t)slot, str); /* steals str; releases the None */
        }
    }
    result = Py_BuildValue("(in)", status, i);
done:
    if (vb.obj) PyBuffer_Release(&vb);
    if (vl.obj) PyBuffer_Release(&vl);
    if (vp.obj) PyBuffer_Release(&vp);
    if (vs.obj) PyBuffer_Release(&vs);
    return result;
}

/* ---- module ------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL | METH_KEYWORDS,
     "crc32c(data, value=0)\n--\n\nCRC32C (Castagnoli) of ``data`` continuing from ``value``."},
    {"build_header", (PyCFunction)(void (*)(void))py_build_header, METH_FASTCALL | METH_KEYWORDS,
     "build_header(field, kind, dtype, gidx, shape)\n--\n\nHeader bytes of one frame."},
    {"frame_head", (PyCFunction)(void (*)(void))py_frame_head, METH_FASTCALL | METH_KEYWORDS,
     "frame_head(header, payload_len, flags, raw_len)\n--\n\n"
     "Prefix + header + zero padding up to the 64-byte-aligned payload start."},
    {"frame_tail", (PyCFunction)(void (*)(void))py_frame_tail, METH_FASTCALL | METH_KEYWORDS,
     "frame_tail(crc, end)\n--\n\nTrailer plus zero padding so the frame ends 64-byte aligned."},
    {"encode_frames", (PyCFunction)(void (*)(void))py_encode_frames, METH_FASTCALL | METH_KEYWORDS,
     "encode_frames(field, kind, dtype, gidxs, shapes, payloads, flags, raw_lens, seg_id, base_offset)\n--\n\n"
     "Encode one frame per payload, concatenated; returns (blob, [(key, value), ...])."},
    {"encode_rows", (PyCFunction)(void (*)(void))py_encode_rows, METH_FASTCALL | METH_KEYWORDS,
     "encode_rows(field, kind, dtype, gidxs, shape, data, row_bytes, rows, seg_id, base_offset)\n--\n\n"
     "encode_frames of rows of one contiguous batch (row ``rows[i]`` of ``data`` for ``gidxs[i]``)."},
    {"check_frames", (PyCFunction)(void (*)(void))py_check_frames, METH_FASTCALL | METH_KEYWORDS,
     "check_frames(buf, locs, gidxs=None, verify=True, index_crc=True, base=0)\n--\n\n"
     "Check every frame the index values ``locs`` name in ``buf`` (offsets minus ``base``):\n"
     "(status, computed_crcs, trailer_crcs) as bytes (one status byte, two u32 per frame)."},
    {"gather_frames", (PyCFunction)(void (*)(void))py_gather_frames, METH_FASTCALL | METH_KEYWORDS,
     "gather_frames(buf, locs, gidxs, template, payload_start, payload_len, out, rows, verify=True)\n--\n\n"
     "Check frames of one head template in ``buf`` and copy their payloads into ``out`` rows:\n"
     "(code, index, expected, actual)."},
    {"copy_ranges", (PyCFunction)(void (*)(void))py_copy_ranges, METH_FASTCALL | METH_KEYWORDS,
     "copy_ranges(src, offsets, lengths, dst)\n--\n\n"
     "Copy the byte ranges of ``src`` (i64 offsets and lengths) back to back into ``dst``; returns the bytes."},
    {"crc32c_frames", (PyCFunction)(void (*)(void))py_crc32c_frames, METH_FASTCALL | METH_KEYWORDS,
     "crc32c_frames(buf, offsets, lengths, value=0)\n--\n\n"
     "The CRC32C continuing ``value`` over the checked frames at ``offsets`` of ``buf`` back to back, from\n"
     "their trailers' CRCs (their covered bytes are not read)."},
    {"restamp_frames", (PyCFunction)(void (*)(void))py_restamp_frames, METH_FASTCALL | METH_KEYWORDS,
     "restamp_frames(buf, offsets, lengths, gidxs)\n--\n\n"
     "Give the frames at ``offsets`` of ``buf`` the global indexes ``gidxs`` (u64), their trailers' CRC32C\n"
     "updated for the change; returns the new CRCs (u32 each)."},
    {"pread_ranges", (PyCFunction)(void (*)(void))py_pread_ranges, METH_FASTCALL | METH_KEYWORDS,
     "pread_ranges(fd, offsets, lengths, dst)\n--\n\n"
     "Read the byte ranges (i64 offsets, lengths) of the open file ``fd`` back to back into ``dst``,\n"
     "without the GIL; returns the bytes read (fewer only when the file ends first)."},
    {"pwrite_ranges", (PyCFunction)(void (*)(void))py_pwrite_ranges, METH_FASTCALL | METH_KEYWORDS,
     "pwrite_ranges(fd, src, offsets, lengths, pos, writeback)\n--\n\n"
     "Write the byte ranges (i64 offsets, lengths) of ``src`` back to back into the open file ``fd`` from\n"
     "``pos``, without the GIL, starting the writeback of every ``writeback`` bytes (> 0); returns the bytes."},
    {"leaf_room", (PyCFunction)(void (*)(void))py_leaf_room, METH_FASTCALL | METH_KEYWORDS,
     "leaf_room(buf, pgnos, page_size)\n--\n\n"
     "(nodes, room) of the LMDB leaf pages ``pgnos`` of ``buf``, their headers checked: leaf_columns' output sizes."},
    {"leaf_columns", (PyCFunction)(void (*)(void))py_leaf_columns, METH_FASTCALL | METH_KEYWORDS,
     "leaf_columns(buf, pgnos, page_size, allowed_flags, keys, key_lens, values, value_lens, flags)\n--\n\n"
     "The entries of the LMDB leaf pages ``pgnos`` (i64, tree order) of the data file ``buf`` into the outputs,\n"
     "every page and node checked, without the GIL: (key bytes, value bytes, big rows)."},
    {"place_keys", (PyCFunction)(void (*)(void))py_place_keys, METH_FASTCALL | METH_KEYWORDS,
     "place_keys(buf, lens, prefix, slots, out)\n--\n\n"
     "Entries of ``buf`` (i64 ``lens``), each ``prefix`` + UTF-8 without NUL, decoded into ``out[slots[i]]``\n"
     "(None before): (status, i), 0 when all are placed, else the first failing entry's reason and index."},
    {"_crc32c_table", py_crc32c_table, METH_VARARGS, "Slice-by-8 CRC32C (the portable fallback)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "tqstore._native._frames",
    "Compiled record hot path (same API and bytes as tqstore._native._pure).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void) {
    crc_init();
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    PyObject *layout = Py_BuildValue(
        "{s:y,s:y,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:y#}", "FRAME_MAGIC", FRAME_MAGIC, "FRAME_END_MAGIC",
        FRAME_END_MAGIC, "FRAME_VERSION", FRAME_VERSION, "ALIGN", ALIGN, "PREFIX_SIZE", PREFIX_SIZE,
        "HEADER_HEAD_SIZE", HEADER_HEAD_SIZE, "TRAILER_SIZE", TRAILER_SIZE, "INDEX_KEY_HEAD_SIZE",
        INDEX_KEY_HEAD_SIZE, "INDEX_VALUE_SIZE", INDEX_VALUE_SIZE, "MAX_FIELD_BYTES", MAX_FIELD_BYTES,
        "MAX_NDIM", MAX_NDIM, "DTYPE_ITEMSIZE", (const char *)dtype_itemsize, (Py_ssize_t)NUM_DTYPES);
    if (!layout || PyModule_AddObject(m, "_LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "IMPLEMENTATION", "native") < 0 ||
        PyModule_AddStringConstant(m, "CRC_BACKEND", crc_backend) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
