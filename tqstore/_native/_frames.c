/*
 * tqstore._native._frames: compiled record hot path.
 *
 * Same functions, arguments, results, exceptions and bytes as tqstore/_native/_pure.py
 * (crc32c, build_header, frame_head, frame_tail, encode_frames, verify_frames, gather_frames)
 * (the reference).  Layout constants repeat tqstore/_native/layout.py and are exposed as
 * ``_LAYOUT`` so the tests can check them against it.
 *
 * CRC32C: SSE4.2 crc32 instruction, three interleaved streams combined with zero-shift
 * tables, chosen at import by CPU detection; slice-by-8 tables otherwise.
 *
 * The GIL is released around work on >= 64 KiB (CRC of a large buffer, framing and
 * verification of many frames); all Python objects are converted and all buffers
 * acquired before, and all results created after, with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stddef.h>
#include <string.h>

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

static void crc_init(void) {
    crc_table_init();
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
            PyObject *key = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(INDEX_KEY_HEAD_SIZE + flen));
            if (!key) goto done;
            uint8_t *kp = (uint8_t *)PyBytes_AS_STRING(key);
            put_be64(kp, it->gidx);
            if (flen) memcpy(kp + INDEX_KEY_HEAD_SIZE, fp, flen);
            PyObject *val = PyBytes_FromStringAndSize(NULL, INDEX_VALUE_SIZE);
            if (!val) {
                Py_DECREF(key);
                goto done;
            }
            uint8_t *vp = (uint8_t *)PyBytes_AS_STRING(val);
            put_le32(vp, (uint32_t)seg_id);
            put_le64(vp + 4, it->off);
            put_le32(vp + 12, it->frame_len);
            put_le32(vp + 16, crcs[i]);
            PyObject *t = PyTuple_New(2);
            if (!t) {
                Py_DECREF(key);
                Py_DECREF(val);
                goto done;
            }
            PyTuple_SET_ITEM(t, 0, key);
            PyTuple_SET_ITEM(t, 1, val);
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

/* ---- verify_frames ----------------------------------------------------------------- */

typedef struct {
    int64_t off, len; /* valid only when status != 1 after pass 1 */
    uint64_t pstart;  /* absolute payload offset */
    uint64_t plen;
    uint32_t crc_exp, crc_act;
    int status;
} ver_item;

/* operator.index(o) as int64; *ok = 0 when it does not fit (any such value makes the
 * frame out of range, whatever the other value). */
static int as_i64(PyObject *o, int64_t *out, int *ok) {
    PyObject *v = PyNumber_Index(o);
    if (!v) return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *ok = !overflow;
    *out = (int64_t)x;
    return 0;
}

static void verify_one(const uint8_t *base, ver_item *it) {
    const uint8_t *f = base + it->off;
    uint64_t length = (uint64_t)it->len;
    uint16_t hlen = get_le16(f + 6);
    uint64_t plen = get_le64(f + 8);
    uint64_t pstart = align_up(PREFIX_SIZE + (uint64_t)hlen);
    it->status = 1;
    if (memcmp(f, FRAME_MAGIC, 4) != 0 || f[4] != FRAME_VERSION) return;
    /* end + TRAILER_SIZE > length, with end = pstart + plen, without overflow */
    if (length < pstart + TRAILER_SIZE || plen > length - pstart - TRAILER_SIZE) return;
    size_t end = (size_t)(pstart + plen);
    if (memcmp(f + end + 4, FRAME_END_MAGIC, 4) != 0) return;
    it->crc_exp = get_le32(f + end);
    it->crc_act = crc_impl(0, f, end);
    it->status = it->crc_act == it->crc_exp ? 0 : 2;
    it->pstart = (uint64_t)it->off + pstart;
    it->plen = plen;
}

static void verify_all(const uint8_t *base, ver_item *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i].status != 1) verify_one(base, &items[i]);
}

static PyObject *py_verify_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
    static const char *const names[] = {"buf", "offsets", "lengths"};
    PyObject *a[3];
    if (parse_args("verify_frames", args, nargs, kwnames, names, 3, 3, a) < 0) return NULL;
    Py_buffer view;
    PyObject *s_off = NULL, *s_len = NULL, *list = NULL, *bad = NULL;
    ver_item *items = NULL;
    if (PyObject_GetBuffer(a[0], &view, PyBUF_FULL_RO) < 0) return NULL;
    if (!PyBuffer_IsContiguous(&view, 'C')) {
        PyErr_SetString(PyExc_TypeError, "memoryview: casts are restricted to C-contiguous views");
        goto fail;
    }
    if (!(s_off = PySequence_Fast(a[1], "offsets must be iterable"))) goto fail;
    if (!(s_len = PySequence_Fast(a[2], "lengths must be iterable"))) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(s_off);
    if (PySequence_Fast_GET_SIZE(s_len) < n) n = PySequence_Fast_GET_SIZE(s_len); /* zip() */
    items = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(ver_item));
    if (!items) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t size = (int64_t)view.len;
    size_t work = 0;
    PyObject **po = PySequence_Fast_ITEMS(s_off);
    PyObject **pl = PySequence_Fast_ITEMS(s_len);
    for (Py_ssize_t i = 0; i < n; i++) {
        ver_item *it = &items[i];
        int ok_off, ok_len;
        if (as_i64(po[i], &it->off, &ok_off) < 0 || as_i64(pl[i], &it->len, &ok_len) < 0) goto fail;
        it->status = 1;
        if (ok_off && ok_len && it->off >= 0 && it->len >= PREFIX_SIZE + TRAILER_SIZE && it->len <= size &&
            it->off <= size - it->len) {
            it->status = -1; /* to check */
            work += (size_t)it->len;
        }
    }
    if (work >= NOGIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS verify_all((const uint8_t *)view.buf, items, n);
        Py_END_ALLOW_THREADS
    } else {
        verify_all((const uint8_t *)view.buf, items, n);
    }
    PyBuffer_Release(&view);
    view.obj = NULL;

    list = PyList_New(n);
    if (!list) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        ver_item *it = &items[i];
        PyObject *t;
        if (it->status == 1) {
            if (!bad && !(bad = Py_BuildValue("(iiiii)", 1, 0, 0, 0, 0))) goto fail;
            Py_INCREF(bad);
            t = bad;
        } else {
            t = PyTuple_New(5);
            if (!t) goto fail;
            PyObject *v0 = PyLong_FromLong(it->status), *v1 = PyLong_FromUnsignedLongLong(it->pstart),
                     *v2 = PyLong_FromUnsignedLongLong(it->plen), *v3 = PyLong_FromUnsignedLong(it->crc_exp),
                     *v4 = PyLong_FromUnsignedLong(it->crc_act);
            PyTuple_SET_ITEM(t, 0, v0);
            PyTuple_SET_ITEM(t, 1, v1);
            PyTuple_SET_ITEM(t, 2, v2);
            PyTuple_SET_ITEM(t, 3, v3);
            PyTuple_SET_ITEM(t, 4, v4);
            if (!v0 || !v1 || !v2 || !v3 || !v4) {
                Py_DECREF(t);
                goto fail;
            }
        }
        PyList_SET_ITEM(list, i, t);
    }
    PyMem_Free(items);
    Py_DECREF(s_off);
    Py_DECREF(s_len);
    Py_XDECREF(bad);
    return list;

fail:
    if (view.obj) PyBuffer_Release(&view);
    PyMem_Free(items);
    Py_XDECREF(s_off);
    Py_XDECREF(s_len);
    Py_XDECREF(list);
    Py_XDECREF(bad);
    return NULL;
}

/* ---- gather_frames ----------------------------------------------------------------- */

/* Result codes (same as _pure.GATHER_*): the first frame, in the order given, that fails
 * a check, and the first check it fails, in this order. */
#define G_OK 0
#define G_DIFFERS 1   /* index length or head bytes differ from the template (another shape) */
#define G_TRUNCATED 2 /* the frame extends past the buffer */
#define G_GIDX 3      /* the frame's gidx is not the row's */
#define G_TORN 4      /* no end magic */
#define G_INDEX_CRC 5 /* the trailer's CRC is not the index's */
#define G_PADDING 6   /* padding after the trailer is not zero */
#define G_CRC 7       /* CRC32C of prefix + header + payload does not match the trailer */

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

static void gather_all(gather_job *j) {
    const uint64_t tpos = j->pstart + j->plen;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        const uint8_t *loc = j->locs + (size_t)i * INDEX_VALUE_SIZE;
        uint64_t off = get_le64(loc + 4);
        uint32_t len = get_le32(loc + 12);
        uint32_t icrc = get_le32(loc + 16);
        uint64_t gidx = get_le64(j->gidxs + (size_t)i * 8);
        int code = G_OK;
        uint64_t exp = 0, act = 0;
        if ((uint64_t)len != j->flen) {
            code = G_DIFFERS;
        } else if (j->flen > j->size || off > j->size - j->flen) {
            code = G_TRUNCATED;
        } else {
            const uint8_t *f = j->base + off;
            const uint8_t *t = f + tpos;
            uint64_t got = get_le64(f + PREFIX_SIZE);
            uint32_t tcrc = get_le32(t);
            if (memcmp(f, j->pre, PREFIX_SIZE) != 0 ||
                memcmp(f + PREFIX_SIZE + 8, j->rest, j->rest_len) != 0) {
                code = G_DIFFERS;
            } else if (got != gidx) {
                code = G_GIDX;
                exp = gidx;
                act = got;
            } else if (memcmp(t + 4, FRAME_END_MAGIC, 4) != 0) {
                code = G_TORN;
            } else if (tcrc != icrc) {
                code = G_INDEX_CRC;
                exp = icrc;
                act = tcrc;
            } else if (!is_zero(t + TRAILER_SIZE, (size_t)(j->flen - tpos - TRAILER_SIZE))) {
                code = G_PADDING;
            } else if (j->verify) {
                uint32_t c = crc_impl(0, f, (size_t)tpos);
                if (c != tcrc) {
                    code = G_CRC;
                    exp = tcrc;
                    act = c;
                }
            }
            if (code == G_OK && j->plen) {
                int64_t r = (int64_t)get_le64(j->rows + (size_t)i * 8);
                memcpy(j->out + (uint64_t)r * j->plen, f + j->pstart, (size_t)j->plen);
            }
        }
        if (code != G_OK) {
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
    {"verify_frames", (PyCFunction)(void (*)(void))py_verify_frames, METH_FASTCALL | METH_KEYWORDS,
     "verify_frames(buf, offsets, lengths)\n--\n\n"
     "Check frames inside ``buf``: [(status, payload_offset, payload_len, crc_expected, crc_actual)]."},
    {"gather_frames", (PyCFunction)(void (*)(void))py_gather_frames, METH_FASTCALL | METH_KEYWORDS,
     "gather_frames(buf, locs, gidxs, template, payload_start, payload_len, out, rows, verify=True)\n--\n\n"
     "Check frames of one head template in ``buf`` and copy their payloads into ``out`` rows:\n"
     "(code, index, expected, actual)."},
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
        "{s:y,s:y,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "FRAME_MAGIC", FRAME_MAGIC, "FRAME_END_MAGIC",
        FRAME_END_MAGIC, "FRAME_VERSION", FRAME_VERSION, "ALIGN", ALIGN, "PREFIX_SIZE", PREFIX_SIZE,
        "HEADER_HEAD_SIZE", HEADER_HEAD_SIZE, "TRAILER_SIZE", TRAILER_SIZE, "INDEX_KEY_HEAD_SIZE",
        INDEX_KEY_HEAD_SIZE, "INDEX_VALUE_SIZE", INDEX_VALUE_SIZE, "MAX_FIELD_BYTES", MAX_FIELD_BYTES,
        "MAX_NDIM", MAX_NDIM);
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
