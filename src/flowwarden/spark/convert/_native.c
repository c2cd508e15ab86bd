/*
 * flowwarden.spark.convert._native: raw change-event BSON straight into Arrow buffers.
 *
 * One pass over each event's bytes writes every column of the default change-event table
 * (the columns, types and values flowwarden.spark.convert.arrow.events_to_arrow writes for decoded
 * events): string columns as validity bitmap + int32 offsets + UTF-8 data, timestamps as
 * validity + int64 microseconds (the cluster time's increment as a plain int64), removed_fields
 * as a list<string>, truncated_arrays as a list<struct<field: string, new_size: int32>>.
 * Extended JSON text is byte for byte what flowwarden.spark.convert.extjson.dumps writes for the
 * decoded value.
 *
 * Hard rule: this module never guesses. An event it does not convert exactly (a BSON type or
 * case it leaves to Python, bytes bson.decode would refuse, a shape events_to_arrow does not
 * expect, a value that does not fit the schema) is taken back out of every column and listed
 * with the reason; the caller converts those events with the Python path and puts them back
 * in their places. When every event is left, the call returns a str naming the first one and
 * why. Every read is bounds-checked against the buffer: malformed or truncated input is left
 * to Python, never a crash.
 *
 * The checks mirror pymongo's bson C decoder (_cbsonmodule.c): document sizes and
 * terminators, strict UTF-8 in keys and strings, booleans 0 or 1, binary subtype 2's inner
 * length. Where bson accepts more than this module (code with scope, DBPointer, binary
 * subtype 2, documents with a "$ref" key that bson turns into DBRef, duplicate keys), this
 * module falls back rather than imitate it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Lengths read from BSON are compared as Py_ssize_t: only 64-bit builds are supported (setup.py
 * skips the module elsewhere, and the Python path converts every batch). */
_Static_assert(sizeof(Py_ssize_t) >= 8, "flowwarden.spark.convert._native needs a 64-bit build");

#define OK 0
#define FALLBACK (-1)
#define PYERR (-2)
#define MAX_DEPTH 100

/* datetime.min and datetime.max in milliseconds since the epoch: bson decodes a BSON date
 * outside them as DatetimeMS (with DATETIME_AUTO), which events_to_arrow does not take as a
 * datetime. */
#define MIN_DATETIME_MS (-62135596800000LL)
#define MAX_DATETIME_MS (253402300799999LL)

static const char *HEX = "0123456789abcdef";

/* ---------------------------------------------------------------------------------------- */
/* Reused output blocks. Writing into fresh memory costs a page fault for every 4 KiB page on
 * first touch, about a fifth of a conversion's CPU time. So the large blocks (a power of two
 * of at least POOL_MIN_BLOCK bytes: every Buf grows by doubling from 4 KiB) go back to a pool
 * when their Arrow buffer is released, up to POOL_MAX_BYTES in all, and the next conversion
 * writes into them: a connector converting batch after batch stops faulting. release_memory()
 * frees the pool. Workers take blocks without the GIL, hence the lock. */

#define POOL_MIN_SHIFT 20
#define POOL_MIN_BLOCK ((Py_ssize_t)1 << POOL_MIN_SHIFT)
#define POOL_CLASSES 12 /* 1 MiB .. 2 GiB */
#define POOL_SLOTS 16
#define POOL_MAX_BYTES ((Py_ssize_t)256 << 20)

static struct {
    PyThread_type_lock lock;
    char *blocks[POOL_CLASSES][POOL_SLOTS];
    int count[POOL_CLASSES];
    Py_ssize_t bytes;
} pool;

/* The pool class of a block of cap bytes, or -1 when blocks of that size are not kept. */
static int pool_class(Py_ssize_t cap) {
    if (cap < POOL_MIN_BLOCK || (cap & (cap - 1)) != 0) {
        return -1;
    }
    int k = 0;
    while (((Py_ssize_t)1 << (POOL_MIN_SHIFT + k)) < cap) {
        k++;
    }
    return k < POOL_CLASSES ? k : -1;
}

static char *pool_take(Py_ssize_t cap) {
    int k = pool_class(cap);
    char *block = NULL;
    if (k < 0) {
        return NULL;
    }
    PyThread_acquire_lock(pool.lock, WAIT_LOCK);
    if (pool.count[k] > 0) {
        block = pool.blocks[k][--pool.count[k]];
        pool.bytes -= cap;
    }
    PyThread_release_lock(pool.lock);
    return block;
}

/* Keeps the block for reuse, or frees it when the pool does not take blocks of its size or is full. */
static void pool_give(char *block, Py_ssize_t cap) {
    int k = pool_class(cap);
    if (block != NULL && k >= 0) {
        PyThread_acquire_lock(pool.lock, WAIT_LOCK);
        int kept = pool.count[k] < POOL_SLOTS && pool.bytes + cap <= POOL_MAX_BYTES;
        if (kept) {
            pool.blocks[k][pool.count[k]++] = block;
            pool.bytes += cap;
        }
        PyThread_release_lock(pool.lock);
        if (kept) {
            return;
        }
    }
    free(block);
}

/* ---------------------------------------------------------------------------------------- */
/* Growable output buffers on the C heap: workers fill them without the GIL, and a finished
 * buffer is handed to pyarrow without a copy, as a NativeBuffer that gives it back to the pool
 * (or frees it) when released. PYERR from here means "out of memory"; the caller raises
 * MemoryError once it holds the GIL. */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    if (need > PY_SSIZE_T_MAX / 4 - b->len) {
        return PYERR;
    }
    while (cap < b->len + need) {
        cap *= 2;
    }
    char *data;
    if (cap < POOL_MIN_BLOCK) {
        data = realloc(b->data, (size_t)cap);
        if (data == NULL) {
            return PYERR;
        }
    } else {
        data = pool_take(cap);
        if (data == NULL && (data = malloc((size_t)cap)) == NULL) {
            return PYERR;
        }
        if (b->len > 0) {
            memcpy(data, b->data, (size_t)b->len);
        }
        pool_give(b->data, b->cap);
    }
    b->data = data;
    b->cap = cap;
    return OK;
}

static inline int reserve(Buf *b, Py_ssize_t n) {
    return (b->len + n <= b->cap) ? OK : buf_grow(b, n);
}

/* Callers reserve first. */
static inline void put(Buf *b, const char *s, Py_ssize_t n) {
    if (n == 0) {
        return; /* an empty buffer has no data pointer yet, and memcpy wants one */
    }
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
}

#define PUT_LITERAL(b, s) put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

static inline void put_char(Buf *b, char c) { b->data[b->len++] = c; }

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} NativeBuffer;

static int native_buffer_get(PyObject *self, Py_buffer *view, int flags) {
    NativeBuffer *b = (NativeBuffer *)self;
    return PyBuffer_FillInfo(view, self, b->data, b->len, 1, flags);
}

static void native_buffer_dealloc(PyObject *self) {
    NativeBuffer *b = (NativeBuffer *)self;
    pool_give(b->data, b->cap);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs native_buffer_procs = {native_buffer_get, NULL};

static PyTypeObject NativeBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flowwarden.spark.convert._native.NativeBuffer",
    .tp_basicsize = sizeof(NativeBuffer),
    .tp_dealloc = native_buffer_dealloc,
    .tp_as_buffer = &native_buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes written by the compiled converter (read-only buffer protocol).",
};

/* The buffer as a NativeBuffer of exactly its length; the Buf gives it up. */
static PyObject *buf_finish(Buf *b) {
    if (b->data == NULL && buf_grow(b, 1) < 0) {
        return PyErr_NoMemory();
    }
    NativeBuffer *out = PyObject_New(NativeBuffer, &NativeBufferType);
    if (out == NULL) {
        return NULL;
    }
    out->data = b->data;
    out->len = b->len;
    out->cap = b->cap;
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)out;
}

static void buf_free(Buf *b) {
    pool_give(b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Reading */

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v; /* little-endian hosts only: see setup.py */
}

static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

typedef struct {
    const char *reason; /* why the event is left to Python */
    int relaxed;
    int closed; /* a typed document's key the plan does not name leaves the event to Python */
    const uint8_t *end; /* end of the event being read: eight bytes before it may be loaded */
} Ctx;

static int fallback(Ctx *ctx, const char *reason) {
    ctx->reason = reason;
    return FALLBACK;
}

/* Strict UTF-8 as Python's decoder checks it: no overlong forms, no surrogates, nothing past
 * U+10FFFF. Returns the length of the sequence at p (at most n bytes), 0 when invalid. */
static inline int utf8_sequence(const uint8_t *p, Py_ssize_t n) {
    uint8_t c = p[0];
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        return (n >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) {
            return 0;
        }
        if (c == 0xE0 && p[1] < 0xA0) {
            return 0;
        }
        if (c == 0xED && p[1] > 0x9F) {
            return 0;
        }
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) {
            return 0;
        }
        if (c == 0xF0 && p[1] < 0x90) {
            return 0;
        }
        if (c == 0xF4 && p[1] > 0x8F) {
            return 0;
        }
        return 4;
    }
    return 0;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Whether none of the 8 bytes of w needs a look: all ASCII, none below 0x20, no '"', no '\\'.
 * (The "has a byte less than n" trick is exact as a yes/no answer.) */
static inline int plain8(uint64_t w) {
    uint64_t control = (w - ONES * 0x20) & ~w;
    uint64_t quote = w ^ (ONES * '"');
    uint64_t backslash = w ^ (ONES * '\\');
    quote = (quote - ONES) & ~quote;
    backslash = (backslash - ONES) & ~backslash;
    return ((w | control | quote | backslash) & HIGHS) == 0;
}

/* The n < 8 bytes at p as one word, the bytes past them replaced by `fill` bytes (read as a
 * whole word when the event has eight bytes there, which is the common case). */
static inline uint64_t short_word(const Ctx *ctx, const uint8_t *p, Py_ssize_t n, uint64_t fill) {
    uint64_t w = fill;
    if (ctx->end - p >= 8) {
        memcpy(&w, p, 8);
        uint64_t mask = n ? (~0ULL >> (64 - 8 * n)) : 0;
        return (w & mask) | (fill & ~mask);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        w = (w & ~(0xFFULL << (8 * i))) | ((uint64_t)p[i] << (8 * i));
    }
    return w;
}

static int utf8_valid(const Ctx *ctx, const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    if (n < 8) {
        if ((short_word(ctx, p, n, 0) & HIGHS) == 0) {
            return 1;
        }
    } else {
        uint64_t w;
        memcpy(&w, p + n - 8, 8);
        int ascii_tail = (w & HIGHS) == 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&w, p + i, 8);
            if ((w & HIGHS) != 0) {
                break;
            }
        }
        if (i + 8 > n && ascii_tail) {
            return 1;
        }
    }
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_sequence(p + i, n - i);
        if (k == 0) {
            return 0;
        }
        i += k;
    }
    return 1;
}

/* The NUL ending the field name at q, looked for before `last`; NULL when there is none.
 * Eight bytes at a time while eight are there (field names are short: usually one step). */
static inline const uint8_t *name_end(const uint8_t *q, const uint8_t *last) {
    const uint8_t *c = q;
    while (last - c >= 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        uint64_t zero = (w - ONES) & ~w & HIGHS;
        if (zero) {
            return c + (__builtin_ctzll(zero) >> 3);
        }
        c += 8;
    }
    while (c < last) {
        if (*c == 0) {
            return c;
        }
        c++;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Writing JSON text (the escaping of json's encode_basestring, ensure_ascii=False) */

static const char ESCAPE_SHORT[32] = {
    0, 0, 0, 0, 0, 0, 0, 0, 'b', 't', 'n', 0, 'f', 'r', 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0,   0,   0,   0, 0,   0,   0, 0,
};

/* A quoted JSON string of n bytes at p, validating UTF-8 as it goes. Plain text (ASCII with
 * nothing to escape) is checked and copied eight bytes at a time; the last partial word is
 * done with the word ending at the string's end (or, for short strings, the word starting at
 * it with the bytes past the string masked off). */
static int put_json_string(Ctx *ctx, Buf *b, const uint8_t *p, Py_ssize_t n) {
    if (reserve(b, n + 2 + 8) < 0) {
        return PYERR;
    }
    put_char(b, '"');
    Py_ssize_t i = 0;
    if (n < 8) {
        uint64_t w = short_word(ctx, p, n, ONES * 'a');
        if (plain8(w)) {
            memcpy(b->data + b->len, &w, 8);
            b->len += n;
            put_char(b, '"');
            return OK;
        }
    }
    while (i < n) {
        uint64_t w;
        while (i + 8 <= n) {
            memcpy(&w, p + i, 8);
            if (!plain8(w)) {
                break;
            }
            memcpy(b->data + b->len, &w, 8);
            b->len += 8;
            i += 8;
        }
        if (i == n) {
            break;
        }
        if (i + 8 > n && n >= 8) {
            memcpy(&w, p + n - 8, 8);
            if (plain8(w)) {
                /* rewrites the last 8 - (n - i) bytes already copied with the same bytes */
                b->len += n - i;
                memcpy(b->data + b->len - 8, &w, 8);
                i = n;
                break;
            }
        }
        uint8_t c = p[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            put_char(b, (char)c);
            i++;
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_sequence(p + i, n - i);
            if (k == 0) {
                return fallback(ctx, "invalid UTF-8 in a string");
            }
            put(b, (const char *)p + i, k);
            i += k;
            continue;
        }
        /* an escape: at most 6 bytes instead of 1 */
        if (reserve(b, (n - i) + 6 + 8 + 1) < 0) {
            return PYERR;
        }
        put_char(b, '\\');
        if (c == '"' || c == '\\') {
            put_char(b, (char)c);
        } else if (ESCAPE_SHORT[c]) {
            put_char(b, ESCAPE_SHORT[c]);
        } else {
            put_char(b, 'u');
            put_char(b, '0');
            put_char(b, '0');
            put_char(b, HEX[c >> 4]);
            put_char(b, HEX[c & 15]);
        }
        i++;
    }
    if (reserve(b, 1) < 0) {
        return PYERR;
    }
    put_char(b, '"');
    return OK;
}

/* The 24 lowercase hex digits of 12 bytes (callers reserve 24 bytes). */
static inline void put_hex12(Buf *b, const uint8_t *p) {
    char *out = b->data + b->len;
    for (int i = 0; i < 12; i++) {
        out[2 * i] = HEX[p[i] >> 4];
        out[2 * i + 1] = HEX[p[i] & 15];
    }
    b->len += 24;
}

/* Decimal digits of v (callers reserve 20 bytes). */
static inline void put_u64(Buf *b, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) {
        b->data[b->len++] = tmp[--n];
    }
}

static inline void put_i64(Buf *b, int64_t v) {
    if (v < 0) {
        put_char(b, '-');
        put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(b, (uint64_t)v);
    }
}

static const double POW10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* float.__repr__ of a finite double.
 *
 * Fast path: a double that equals m / 10**k for an integer m of at most 15 digits (prices,
 * quantities, most hand-typed numbers). Decimals of at most 15 significant digits convert to
 * distinct doubles (DBL_DIG), so that decimal is the only one of <= 15 digits naming this
 * double, hence the shortest one, which is what repr prints. m and 10**k are exact doubles and
 * IEEE division rounds correctly, so m / 10**k == d is exactly "the decimal reads back as d".
 * Everything else goes through PyOS_double_to_string, repr's own formatter. */
static int put_double_repr(Buf *b, double d) {
    if (reserve(b, 32) < 0) {
        return PYERR;
    }
    if (d == 0.0) {
        if (signbit(d)) {
            PUT_LITERAL(b, "-0.0");
        } else {
            PUT_LITERAL(b, "0.0");
        }
        return OK;
    }
    double a = fabs(d);
    if (a >= 1e-3 && a < 1e15) {
        for (int k = 0; k <= 17; k++) {
            double scaled = a * POW10[k];
            if (scaled >= 1e15) {
                break;
            }
            double m = nearbyint(scaled);
            if (m / POW10[k] == a) {
                /* digits of m, with the decimal point k places from the right */
                uint64_t mi = (uint64_t)m;
                while (k > 0 && mi % 10 == 0) {
                    mi /= 10;
                    k--;
                }
                char digits[24];
                int n = 0;
                do {
                    digits[n++] = (char)('0' + mi % 10);
                    mi /= 10;
                } while (mi);
                /* digits are reversed: digits[n-1] is the most significant */
                if (d < 0) {
                    put_char(b, '-');
                }
                int point = n - k; /* digits before the decimal point */
                if (point <= 0) {
                    put_char(b, '0');
                    put_char(b, '.');
                    for (int z = 0; z < -point; z++) {
                        put_char(b, '0');
                    }
                    while (n) {
                        put_char(b, digits[--n]);
                    }
                } else {
                    for (int z = 0; z < point; z++) {
                        put_char(b, digits[--n]);
                    }
                    put_char(b, '.');
                    if (n == 0) {
                        put_char(b, '0');
                    }
                    while (n) {
                        put_char(b, digits[--n]);
                    }
                }
                return OK;
            }
        }
    }
    /* repr's own formatter allocates with PyMem: it runs holding the GIL */
    PyGILState_STATE gil = PyGILState_Ensure();
    char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    int rc = PYERR;
    if (text != NULL) {
        Py_ssize_t n = (Py_ssize_t)strlen(text);
        if (reserve(b, n) == OK) {
            put(b, text, n);
            rc = OK;
        }
        PyMem_Free(text);
    }
    PyErr_Clear(); /* a failure here is reported as MemoryError by the caller */
    PyGILState_Release(gil);
    return rc;
}

static int put_double(Ctx *ctx, Buf *b, double d) {
    if (reserve(b, 32) < 0) {
        return PYERR;
    }
    if (isnan(d)) {
        PUT_LITERAL(b, "{\"$numberDouble\":\"NaN\"}");
        return OK;
    }
    if (isinf(d)) {
        if (d > 0) {
            PUT_LITERAL(b, "{\"$numberDouble\":\"Infinity\"}");
        } else {
            PUT_LITERAL(b, "{\"$numberDouble\":\"-Infinity\"}");
        }
        return OK;
    }
    if (ctx->relaxed) {
        return put_double_repr(b, d);
    }
    PUT_LITERAL(b, "{\"$numberDouble\":\"");
    int rc = put_double_repr(b, d);
    if (rc < 0) {
        return rc;
    }
    if (reserve(b, 2) < 0) {
        return PYERR;
    }
    PUT_LITERAL(b, "\"}");
    return OK;
}

/* str(Decimal128) for the canonical encodings; NaN, infinities, non-canonical and clamped
 * ones are the caller's (see decimal128_text in extjson.py for the rule). */
static int put_decimal128(Ctx *ctx, Buf *b, const uint8_t *p) {
    uint64_t low = rd64(p), high = rd64(p + 8);
    const char *sign = (high >> 63) ? "-" : "";
    if (reserve(b, 128) < 0) {
        return PYERR;
    }
    PUT_LITERAL(b, "{\"$numberDecimal\":\"");
    if ((high & 0x7C00000000000000ULL) == 0x7C00000000000000ULL) {
        /* every NaN, signalling or not, of either sign: "NaN" (the drivers spec) */
        PUT_LITERAL(b, "NaN\"}");
        return OK;
    }
    if ((high & 0x7800000000000000ULL) == 0x7800000000000000ULL) {
        put(b, sign, (Py_ssize_t)strlen(sign));
        PUT_LITERAL(b, "Infinity\"}");
        return OK;
    }
    if ((high & 0x6000000000000000ULL) == 0x6000000000000000ULL) {
        return fallback(ctx, "a non-canonical Decimal128");
    }
    int exponent = (int)((high >> 49) & 0x3FFF) - 6176;
    unsigned __int128 coefficient = ((unsigned __int128)(high & ((1ULL << 49) - 1)) << 64) | low;
    /* 10**34 - 1 */
    const unsigned __int128 max_coefficient =
        (unsigned __int128)999999999999999ULL * 10000000000000000000ULL + 9999999999999999999ULL;
    if (coefficient > max_coefficient || exponent > 6111) {
        return fallback(ctx, "a Decimal128 bson writes in clamped or non-canonical form");
    }
    char digits[40];
    int n = 0;
    while (coefficient >> 64) {
        digits[n++] = (char)('0' + (int)(coefficient % 10));
        coefficient /= 10;
    }
    uint64_t small = (uint64_t)coefficient;
    do {
        digits[n++] = (char)('0' + (int)(small % 10));
        small /= 10;
    } while (small);
    /* digits reversed; n digits */
    int adjusted = exponent + n - 1;
    put(b, sign, (Py_ssize_t)strlen(sign));
    if (exponent <= 0 && adjusted >= -6) {
        int point = n + exponent;
        if (exponent == 0) {
            while (n) {
                put_char(b, digits[--n]);
            }
        } else if (point > 0) {
            for (int z = 0; z < point; z++) {
                put_char(b, digits[--n]);
            }
            put_char(b, '.');
            while (n) {
                put_char(b, digits[--n]);
            }
        } else {
            put_char(b, '0');
            put_char(b, '.');
            for (int z = 0; z < -point; z++) {
                put_char(b, '0');
            }
            while (n) {
                put_char(b, digits[--n]);
            }
        }
    } else {
        put_char(b, digits[--n]);
        if (n) {
            put_char(b, '.');
            while (n) {
                put_char(b, digits[--n]);
            }
        }
        put_char(b, 'E');
        put_char(b, adjusted >= 0 ? '+' : '-');
        put_u64(b, (uint64_t)(adjusted >= 0 ? adjusted : -adjusted));
    }
    PUT_LITERAL(b, "\"}");
    return OK;
}

static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t year = (int64_t)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = year + (*m <= 2);
}

static inline void put_2(Buf *b, unsigned v) {
    put_char(b, (char)('0' + v / 10));
    put_char(b, (char)('0' + v % 10));
}

static int put_datetime(Ctx *ctx, Buf *b, int64_t ms) {
    if (reserve(b, 64) < 0) {
        return PYERR;
    }
    if (ctx->relaxed && ms >= 0 && ms <= MAX_DATETIME_MS) {
        /* json_util's relaxed form: ISO-8601 UTC from the epoch to year 9999, else canonical */
        int64_t days = ms / 86400000, rest = ms % 86400000;
        int64_t year;
        unsigned month, day;
        civil_from_days(days, &year, &month, &day);
        unsigned seconds = (unsigned)(rest / 1000), millis = (unsigned)(rest % 1000);
        PUT_LITERAL(b, "{\"$date\":\"");
        put_char(b, (char)('0' + year / 1000));
        put_char(b, (char)('0' + year / 100 % 10));
        put_2(b, (unsigned)(year % 100));
        put_char(b, '-');
        put_2(b, month);
        put_char(b, '-');
        put_2(b, day);
        put_char(b, 'T');
        put_2(b, seconds / 3600);
        put_char(b, ':');
        put_2(b, seconds / 60 % 60);
        put_char(b, ':');
        put_2(b, seconds % 60);
        if (millis) {
            put_char(b, '.');
            put_char(b, (char)('0' + millis / 100));
            put_2(b, millis % 100);
        }
        PUT_LITERAL(b, "Z\"}");
        return OK;
    }
    PUT_LITERAL(b, "{\"$date\":{\"$numberLong\":\"");
    put_i64(b, ms);
    PUT_LITERAL(b, "\"}}");
    return OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int put_binary(Buf *b, const uint8_t *p, Py_ssize_t n, unsigned subtype) {
    if (reserve(b, (n + 2) / 3 * 4 + 64) < 0) {
        return PYERR;
    }
    PUT_LITERAL(b, "{\"$binary\":{\"base64\":\"");
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8) | p[i + 2];
        put_char(b, B64[v >> 18]);
        put_char(b, B64[(v >> 12) & 63]);
        put_char(b, B64[(v >> 6) & 63]);
        put_char(b, B64[v & 63]);
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        put_char(b, B64[v >> 18]);
        put_char(b, B64[(v >> 12) & 63]);
        PUT_LITERAL(b, "==");
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8);
        put_char(b, B64[v >> 18]);
        put_char(b, B64[(v >> 12) & 63]);
        put_char(b, B64[(v >> 6) & 63]);
        put_char(b, '=');
    }
    PUT_LITERAL(b, "\",\"subType\":\"");
    put_char(b, HEX[subtype >> 4]);
    put_char(b, HEX[subtype & 15]);
    PUT_LITERAL(b, "\"}}");
    return OK;
}

/* ---------------------------------------------------------------------------------------- */
/* BSON structure */

/* The size of the embedded document or array at p, with avail bytes before its container's
 * terminator; -1 when it does not fit or lacks its terminator. */
static inline Py_ssize_t doc_size(const uint8_t *p, Py_ssize_t avail) {
    if (avail < 5) {
        return -1;
    }
    uint32_t size = rd32(p);
    if (size < 5 || size > INT32_MAX || (int64_t)size > (int64_t)avail || p[size - 1] != 0) {
        return -1;
    }
    return (Py_ssize_t)size;
}

/* The length of a BSON string value (int32 length, bytes, NUL) at p, checked the way bson
 * checks it; the text is at p + 4 and has *text_len bytes. -1 when malformed. */
static inline Py_ssize_t string_value(const uint8_t *p, Py_ssize_t avail, Py_ssize_t *text_len) {
    if (avail < 4) {
        return -1;
    }
    uint32_t n = rd32(p);
    if (n == 0 || n > INT32_MAX || (int64_t)n > (int64_t)avail - 4 || p[4 + n - 1] != 0) {
        return -1;
    }
    *text_len = (Py_ssize_t)n - 1;
    return 4 + (Py_ssize_t)n;
}

static int validate_document(Ctx *ctx, const uint8_t *p, Py_ssize_t size, int is_array, int depth);

/* Checks one value of BSON type t at p (avail bytes up to its container's terminator) the way
 * bson.decode would, without writing anything: the parts of an event no column shows still
 * have to decode. Sets *used to the value's length. `shallow` 1 leaves the inside of documents
 * and arrays, 2 also the text of strings, to a converter that checks them as it reads them. */
static int validate_value(Ctx *ctx, uint8_t t, const uint8_t *p, Py_ssize_t avail, Py_ssize_t *used,
                          int depth, int shallow) {
    Py_ssize_t n, text;
    switch (t) {
    case 0x01: /* double */
    case 0x09: /* date */
    case 0x11: /* timestamp */
    case 0x12: /* int64 */
        n = 8;
        break;
    case 0x02: /* string */
    case 0x0D: /* code */
    case 0x0E: /* symbol */
        n = string_value(p, avail, &text);
        if (n < 0) {
            return fallback(ctx, "a malformed string");
        }
        if (shallow < 2 && !utf8_valid(ctx, p + 4, text)) {
            return fallback(ctx, "invalid UTF-8 in a string");
        }
        break;
    case 0x03: /* document */
    case 0x04: /* array */
        n = doc_size(p, avail);
        if (n < 0) {
            return fallback(ctx, "a malformed embedded document");
        }
        if (!shallow) {
            int rc = validate_document(ctx, p, n, t == 0x04, depth + 1);
            if (rc < 0) {
                return rc;
            }
        }
        break;
    case 0x05: /* binary */
        if (avail < 5) {
            return fallback(ctx, "a malformed binary");
        }
        n = (Py_ssize_t)rd32(p);
        if (n > avail - 5) {
            return fallback(ctx, "a malformed binary");
        }
        if (p[4] == 2 && (n < 4 || (Py_ssize_t)rd32(p + 5) != n - 4)) {
            return fallback(ctx, "a malformed binary of subtype 2");
        }
        n += 5;
        break;
    case 0x06: /* undefined */
    case 0x0A: /* null */
    case 0x7F: /* maxkey */
    case 0xFF: /* minkey */
        n = 0;
        break;
    case 0x07: /* objectid */
        n = 12;
        break;
    case 0x08: /* bool */
        if (avail < 1 || p[0] > 1) {
            return fallback(ctx, "a malformed boolean");
        }
        n = 1;
        break;
    case 0x0B: /* regex: two cstrings */
    {
        const uint8_t *nul = memchr(p, 0, (size_t)avail);
        if (nul == NULL) {
            return fallback(ctx, "a malformed regular expression");
        }
        Py_ssize_t pattern = nul - p;
        const uint8_t *nul2 = memchr(nul + 1, 0, (size_t)(avail - pattern - 1));
        if (nul2 == NULL) {
            return fallback(ctx, "a malformed regular expression");
        }
        if (!utf8_valid(ctx, p, pattern) || !utf8_valid(ctx, nul + 1, nul2 - nul - 1)) {
            return fallback(ctx, "invalid UTF-8 in a regular expression");
        }
        n = nul2 + 1 - p;
        break;
    }
    case 0x0C: /* DBPointer: string + ObjectId */
        n = string_value(p, avail, &text);
        if (n < 0 || n + 12 > avail) {
            return fallback(ctx, "a malformed DBPointer");
        }
        if (!utf8_valid(ctx, p + 4, text)) {
            return fallback(ctx, "invalid UTF-8 in a DBPointer");
        }
        n += 12;
        break;
    case 0x10: /* int32 */
        n = 4;
        break;
    case 0x13: /* decimal128 */
        n = 16;
        break;
    default: /* code with scope, and unknown types */
        return fallback(ctx, "a BSON type converted in Python (code with scope or unknown)");
    }
    if (n > avail) {
        return fallback(ctx, "a value longer than its document");
    }
    *used = n;
    return OK;
}

/* The elements of the document or array at p (size bytes, header and terminator checked). */
static int validate_document(Ctx *ctx, const uint8_t *p, Py_ssize_t size, int is_array, int depth) {
    if (depth > MAX_DEPTH) {
        return fallback(ctx, "documents nested too deeply");
    }
    const uint8_t *q = p + 4, *last = p + size - 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        if (nul == NULL) {
            return fallback(ctx, "a malformed field name");
        }
        if (!is_array && !utf8_valid(ctx, q, nul - q)) {
            return fallback(ctx, "invalid UTF-8 in a field name");
        }
        q = nul + 1;
        Py_ssize_t used;
        int rc = validate_value(ctx, t, q, last - q, &used, depth, 0);
        if (rc < 0) {
            return rc;
        }
        q += used;
    }
    return OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Extended JSON of a BSON value */

typedef struct {
    const uint8_t *key;
    Py_ssize_t len;
    uint32_t sketch; /* length and three bytes: unequal sketches, unequal keys */
} Key;

/* Keys of the documents being written, one stack shared by all nesting levels. */
typedef struct {
    Key *keys;
    Py_ssize_t len;
    Py_ssize_t cap;
} KeyStack;

static int keys_grow(KeyStack *s);

static inline int keys_push(KeyStack *s, const uint8_t *key, Py_ssize_t len) {
    if (s->len == s->cap && keys_grow(s) < 0) {
        return PYERR;
    }
    Key *k = &s->keys[s->len++];
    k->key = key;
    k->len = len;
    k->sketch = len ? ((uint32_t)len << 16) ^ ((uint32_t)key[0] << 8) ^ key[len - 1] : 0;
    return OK;
}

static int keys_grow(KeyStack *s) {
    Py_ssize_t cap = s->cap ? s->cap * 2 : 256;
    Key *keys = realloc(s->keys, (size_t)cap * sizeof(Key));
    if (keys == NULL) {
        return PYERR;
    }
    s->keys = keys;
    s->cap = cap;
    return OK;
}

static int key_order(const void *a, const void *b) {
    const Key *x = a, *y = b;
    if (x->len != y->len) {
        return x->len < y->len ? -1 : 1;
    }
    return memcmp(x->key, y->key, (size_t)x->len);
}

/* Whether two of keys[0..n) are equal (a decoded dict keeps one of them, at the first one's
 * place with the last one's value: not worth imitating). */
static int has_duplicates(Key *keys, Py_ssize_t n) {
    if (n <= 16) {
        for (Py_ssize_t i = 1; i < n; i++) {
            for (Py_ssize_t j = 0; j < i; j++) {
                if (keys[i].sketch == keys[j].sketch && keys[i].len == keys[j].len &&
                    memcmp(keys[i].key, keys[j].key, (size_t)keys[i].len) == 0) {
                    return 1;
                }
            }
        }
        return 0;
    }
    /* the keys are only pointers into the input: sorting them in place is fine */
    qsort(keys, (size_t)n, sizeof(Key), key_order);
    for (Py_ssize_t i = 1; i < n; i++) {
        if (key_order(&keys[i - 1], &keys[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

typedef struct {
    Ctx *ctx;
    KeyStack keys;
} Writer;

static int write_document(Writer *w, Buf *b, const uint8_t *p, Py_ssize_t size, int is_array, int depth);

static int write_value(Writer *w, Buf *b, uint8_t t, const uint8_t *p, Py_ssize_t avail, Py_ssize_t *used,
                       int depth) {
    Ctx *ctx = w->ctx;
    Py_ssize_t n, text;
    int rc = OK;
    switch (t) {
    case 0x01: { /* double */
        if (avail < 8) {
            return fallback(ctx, "a truncated double");
        }
        uint64_t bits = rd64(p);
        double d;
        memcpy(&d, &bits, 8);
        rc = put_double(ctx, b, d);
        n = 8;
        break;
    }
    case 0x02: /* string */
    case 0x0E: /* symbol: decoded as str */
        n = string_value(p, avail, &text);
        if (n < 0) {
            return fallback(ctx, "a malformed string");
        }
        rc = put_json_string(ctx, b, p + 4, text);
        break;
    case 0x03:
    case 0x04:
        n = doc_size(p, avail);
        if (n < 0) {
            return fallback(ctx, "a malformed embedded document");
        }
        rc = write_document(w, b, p, n, t == 0x04, depth + 1);
        break;
    case 0x05: { /* binary */
        if (avail < 5) {
            return fallback(ctx, "a malformed binary");
        }
        n = (Py_ssize_t)rd32(p);
        if (n > avail - 5) {
            return fallback(ctx, "a malformed binary");
        }
        unsigned subtype = p[4];
        if (subtype == 2) {
            return fallback(ctx, "binary subtype 2 (converted in Python)");
        }
        rc = put_binary(b, p + 5, n, subtype);
        n += 5;
        break;
    }
    case 0x06: /* undefined: decoded as None */
    case 0x0A:
        if (reserve(b, 4) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "null");
        n = 0;
        break;
    case 0x07: /* ObjectId */
        if (avail < 12) {
            return fallback(ctx, "a truncated ObjectId");
        }
        if (reserve(b, 36) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$oid\":\"");
        put_hex12(b, p);
        PUT_LITERAL(b, "\"}");
        n = 12;
        break;
    case 0x08:
        if (avail < 1 || p[0] > 1) {
            return fallback(ctx, "a malformed boolean");
        }
        if (reserve(b, 5) < 0) {
            return PYERR;
        }
        if (p[0]) {
            PUT_LITERAL(b, "true");
        } else {
            PUT_LITERAL(b, "false");
        }
        n = 1;
        break;
    case 0x09:
        if (avail < 8) {
            return fallback(ctx, "a truncated date");
        }
        rc = put_datetime(ctx, b, (int64_t)rd64(p));
        n = 8;
        break;
    case 0x0B: { /* regex */
        const uint8_t *nul = memchr(p, 0, (size_t)avail);
        if (nul == NULL) {
            return fallback(ctx, "a malformed regular expression");
        }
        Py_ssize_t pattern = nul - p;
        const uint8_t *flags = nul + 1;
        const uint8_t *nul2 = memchr(flags, 0, (size_t)(avail - pattern - 1));
        if (nul2 == NULL) {
            return fallback(ctx, "a malformed regular expression");
        }
        if (!utf8_valid(ctx, flags, nul2 - flags)) {
            return fallback(ctx, "invalid UTF-8 in a regular expression");
        }
        int seen[6] = {0, 0, 0, 0, 0, 0};
        static const char LETTERS[] = "ilmsux";
        for (const uint8_t *f = flags; f < nul2; f++) {
            const char *at = memchr(LETTERS, *f, 6);
            if (at != NULL && *f) {
                seen[at - LETTERS] = 1;
            }
        }
        if (reserve(b, 48) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$regularExpression\":{\"pattern\":");
        rc = put_json_string(ctx, b, p, pattern);
        if (rc < 0) {
            return rc;
        }
        if (reserve(b, 32) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, ",\"options\":\"");
        for (int i = 0; i < 6; i++) {
            if (seen[i]) {
                put_char(b, LETTERS[i]);
            }
        }
        PUT_LITERAL(b, "\"}}");
        n = nul2 + 1 - p;
        break;
    }
    case 0x0D: /* code without scope */
        n = string_value(p, avail, &text);
        if (n < 0) {
            return fallback(ctx, "a malformed code string");
        }
        if (reserve(b, 9) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$code\":");
        rc = put_json_string(ctx, b, p + 4, text);
        if (rc == OK) {
            if (reserve(b, 1) < 0) {
                return PYERR;
            }
            put_char(b, '}');
        }
        break;
    case 0x10: /* int32 */
        if (avail < 4) {
            return fallback(ctx, "a truncated int32");
        }
        if (reserve(b, 32) < 0) {
            return PYERR;
        }
        if (ctx->relaxed) {
            put_i64(b, (int32_t)rd32(p));
        } else {
            PUT_LITERAL(b, "{\"$numberInt\":\"");
            put_i64(b, (int32_t)rd32(p));
            PUT_LITERAL(b, "\"}");
        }
        n = 4;
        break;
    case 0x11: /* timestamp: increment, then time */
        if (avail < 8) {
            return fallback(ctx, "a truncated timestamp");
        }
        if (reserve(b, 64) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$timestamp\":{\"t\":");
        put_u64(b, rd32(p + 4));
        PUT_LITERAL(b, ",\"i\":");
        put_u64(b, rd32(p));
        PUT_LITERAL(b, "}}");
        n = 8;
        break;
    case 0x12: /* int64: decoded as bson.Int64 */
        if (avail < 8) {
            return fallback(ctx, "a truncated int64");
        }
        if (reserve(b, 48) < 0) {
            return PYERR;
        }
        if (ctx->relaxed) {
            put_i64(b, (int64_t)rd64(p));
        } else {
            PUT_LITERAL(b, "{\"$numberLong\":\"");
            put_i64(b, (int64_t)rd64(p));
            PUT_LITERAL(b, "\"}");
        }
        n = 8;
        break;
    case 0x13:
        if (avail < 16) {
            return fallback(ctx, "a truncated Decimal128");
        }
        rc = put_decimal128(ctx, b, p);
        n = 16;
        break;
    case 0x7F:
        if (reserve(b, 16) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$maxKey\":1}");
        n = 0;
        break;
    case 0xFF:
        if (reserve(b, 16) < 0) {
            return PYERR;
        }
        PUT_LITERAL(b, "{\"$minKey\":1}");
        n = 0;
        break;
    case 0x0C:
        return fallback(ctx, "a DBPointer (converted in Python)");
    case 0x0F:
        return fallback(ctx, "code with scope (converted in Python)");
    default:
        return fallback(ctx, "an unknown BSON type");
    }
    if (rc < 0) {
        return rc;
    }
    *used = n;
    return OK;
}

static int write_document(Writer *w, Buf *b, const uint8_t *p, Py_ssize_t size, int is_array, int depth) {
    Ctx *ctx = w->ctx;
    if (depth > MAX_DEPTH) {
        return fallback(ctx, "documents nested too deeply");
    }
    Py_ssize_t first_key = w->keys.len;
    const uint8_t *q = p + 4, *last = p + size - 1;
    if (reserve(b, 1) < 0) {
        return PYERR;
    }
    put_char(b, is_array ? '[' : '{');
    int first = 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        if (nul == NULL) {
            return fallback(ctx, "a malformed field name");
        }
        Py_ssize_t key_len = nul - q;
        if (!first) {
            if (reserve(b, 1) < 0) {
                return PYERR;
            }
            put_char(b, ',');
        }
        first = 0;
        if (!is_array) {
            if (key_len == 4 && memcmp(q, "$ref", 4) == 0) {
                return fallback(ctx, "a document with a $ref key (bson may decode it as a DBRef)");
            }
            int rc = put_json_string(ctx, b, q, key_len);
            if (rc < 0) {
                return rc;
            }
            if (reserve(b, 1) < 0) {
                return PYERR;
            }
            put_char(b, ':');
            if (keys_push(&w->keys, q, key_len) < 0) {
                return PYERR;
            }
        }
        q = nul + 1;
        Py_ssize_t used;
        int rc = write_value(w, b, t, q, last - q, &used, depth);
        if (rc < 0) {
            return rc;
        }
        q += used;
    }
    if (!is_array && has_duplicates(w->keys.keys + first_key, w->keys.len - first_key)) {
        return fallback(ctx, "a document with a repeated field name");
    }
    w->keys.len = first_key;
    if (reserve(b, 1) < 0) {
        return PYERR;
    }
    put_char(b, is_array ? ']' : '}');
    return OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Columns */

typedef struct {
    Py_ssize_t count;  /* rows written */
    Py_ssize_t nulls;
    uint8_t *validity; /* bitmap of `capacity` rows, all set at first */
    PyObject *validity_obj;
    int32_t *offsets;
    PyObject *offsets_obj;
    Buf data;
} StringColumn;

/* int64 values: timestamps (microseconds) and the cluster time's increment */
typedef struct {
    Py_ssize_t count;
    Py_ssize_t nulls;
    uint8_t *validity;
    PyObject *validity_obj;
    int64_t *values;
    PyObject *values_obj;
} Int64Column;

typedef struct {
    StringColumn lists;  /* validity + list offsets; its data holds nothing */
    Buf element_offsets; /* int32 */
    Buf element_data;
    Py_ssize_t elements;
} StringListColumn;

/* truncated_arrays, a list<struct<field: string, new_size: int32>>: the list offsets and the
 * `field` strings as in a StringListColumn, and each element's new_size beside them. No
 * element nor field is ever null: an event with another shape is left to Python. */
typedef struct {
    StringListColumn fields;
    Buf sizes; /* int32 */
} TruncationsColumn;

static int new_bitmap(Py_ssize_t rows, PyObject **obj, uint8_t **bits) {
    Py_ssize_t n = (rows + 7) / 8;
    *obj = PyBytes_FromStringAndSize(NULL, n);
    if (*obj == NULL) {
        return PYERR;
    }
    *bits = (uint8_t *)PyBytes_AS_STRING(*obj);
    memset(*bits, 0xFF, (size_t)n);
    return OK;
}

static int string_column_init(StringColumn *c, Py_ssize_t rows) {
    memset(c, 0, sizeof(*c));
    if (new_bitmap(rows, &c->validity_obj, &c->validity) < 0) {
        return PYERR;
    }
    c->offsets_obj = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4);
    if (c->offsets_obj == NULL) {
        return PYERR;
    }
    c->offsets = (int32_t *)PyBytes_AS_STRING(c->offsets_obj);
    c->offsets[0] = 0;
    return OK;
}

static void string_column_free(StringColumn *c) {
    Py_CLEAR(c->validity_obj);
    Py_CLEAR(c->offsets_obj);
    buf_free(&c->data);
}

/* Ends the current row (whose text is already in data). */
static inline int string_end_row(Ctx *ctx, StringColumn *c) {
    if (c->data.len > INT32_MAX) {
        return fallback(ctx, "a column of more than 2 GiB of text");
    }
    c->offsets[++c->count] = (int32_t)c->data.len;
    return OK;
}

static inline int string_null(Ctx *ctx, StringColumn *c) {
    int rc = string_end_row(ctx, c);
    if (rc < 0) {
        return rc;
    }
    c->validity[(c->count - 1) / 8] &= (uint8_t)~(1u << ((c->count - 1) % 8));
    c->nulls++;
    return OK;
}

static int int64_column_init(Int64Column *c, Py_ssize_t rows) {
    memset(c, 0, sizeof(*c));
    if (new_bitmap(rows, &c->validity_obj, &c->validity) < 0) {
        return PYERR;
    }
    c->values_obj = PyBytes_FromStringAndSize(NULL, rows * 8 > 0 ? rows * 8 : 0);
    if (c->values_obj == NULL) {
        return PYERR;
    }
    c->values = (int64_t *)PyBytes_AS_STRING(c->values_obj);
    return OK;
}

static void int64_column_free(Int64Column *c) {
    Py_CLEAR(c->validity_obj);
    Py_CLEAR(c->values_obj);
}

static inline void int64_put(Int64Column *c, int64_t value) { c->values[c->count++] = value; }

static inline void int64_null(Int64Column *c) {
    c->validity[c->count / 8] &= (uint8_t)~(1u << (c->count % 8));
    c->values[c->count++] = 0;
    c->nulls++;
}

/* (validity or None, null count, buffers...) */
static PyObject *validity_or_none(PyObject **obj, Py_ssize_t nulls) {
    if (nulls == 0) {
        Py_RETURN_NONE;
    }
    PyObject *out = *obj;
    *obj = NULL;
    return out;
}

static PyObject *string_column_result(StringColumn *c) {
    PyObject *data = buf_finish(&c->data);
    if (data == NULL) {
        return NULL;
    }
    PyObject *validity = validity_or_none(&c->validity_obj, c->nulls);
    PyObject *offsets = c->offsets_obj;
    c->offsets_obj = NULL;
    return Py_BuildValue("(NnNN)", validity, c->nulls, offsets, data);
}

static PyObject *int64_column_result(Int64Column *c) {
    PyObject *validity = validity_or_none(&c->validity_obj, c->nulls);
    PyObject *values = c->values_obj;
    c->values_obj = NULL;
    return Py_BuildValue("(NnN)", validity, c->nulls, values);
}

/* ---------------------------------------------------------------------------------------- */
/* Typed documents: a schema plan (compiled in flowwarden.spark.convert.native from the ValueSpec tree)
 * drives one column builder per struct field, list element and map value.
 *
 * Only values that fit are converted here: an event with a value that does not fit (or that
 * the Python path converts by rules not repeated here) is left to Python, which finds and
 * reports every misfit with its own messages. */

enum {
    K_STRING = 1,
    K_UUID,
    K_JSON,
    K_INT8,
    K_INT16,
    K_INT32,
    K_INT64,
    K_FLOAT,
    K_DOUBLE,
    K_BOOL,
    K_TIMESTAMP,
    K_TIMESTAMP_NTZ,
    K_DATE,
    K_DECIMAL,
    K_BINARY,
    K_LIST,
    K_MAP,
    K_STRUCT,
};

enum { D_NONE = 0, D_NULL, D_BSON, D_PYTHON };

struct Node;

typedef struct {
    const uint8_t *key;
    Py_ssize_t key_len;
    struct Node *node;
    int none_ok;
    int default_kind;              /* D_*: what a missing key gives */
    const uint8_t *default_value;  /* D_BSON: the value, of type default_type */
    Py_ssize_t default_avail;
    uint8_t default_type;
} StructField;

typedef struct Node {
    int kind;
    int element_nullable;
    int precision, scale;
    /* allowed values (an enum's or literal's), parsed into C values; none: any value */
    int has_choices;
    Py_ssize_t nchoices;
    const uint8_t **choice_text; /* strings: UTF-8 bytes of the plan, alive during the call */
    Py_ssize_t *choice_len;
    int64_t *choice_int;
    double *choice_double;
    int choice_bool[2];
    struct Node *child;  /* LIST element, MAP value */
    struct Node *keys;   /* MAP keys (a K_STRING node) */
    StructField *fields;
    Py_ssize_t nfields;
    /* output */
    Py_ssize_t count, nulls;
    Py_ssize_t leading_nulls; /* STRUCT: null rows not yet given to the children (a column that
                                 stays all null becomes pa.nulls and never needs them) */
    Buf validity, values, offsets, data;
} Node;

static void node_free(Node *n) {
    if (n == NULL) {
        return;
    }
    node_free(n->child);
    node_free(n->keys);
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        node_free(n->fields[i].node);
    }
    PyMem_Free(n->fields);
    PyMem_Free(n->choice_text);
    PyMem_Free(n->choice_len);
    PyMem_Free(n->choice_int);
    PyMem_Free(n->choice_double);
    buf_free(&n->validity);
    buf_free(&n->values);
    buf_free(&n->offsets);
    buf_free(&n->data);
    PyMem_Free(n);
}

static int node_start(Node *n) {
    if (n->kind == K_STRING || n->kind == K_UUID || n->kind == K_JSON || n->kind == K_BINARY ||
        n->kind == K_LIST || n->kind == K_MAP) {
        int32_t zero = 0;
        if (reserve(&n->offsets, 4) < 0) {
            return PYERR;
        }
        put(&n->offsets, (const char *)&zero, 4);
    }
    return OK;
}

static int parse_choices(Node *n, PyObject *choices) {
    if (!PyTuple_Check(choices)) {
        PyErr_SetString(PyExc_TypeError, "choices must be a tuple");
        return PYERR;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(choices);
    n->has_choices = 1;
    n->choice_text = PyMem_Calloc((size_t)count + 1, sizeof(*n->choice_text));
    n->choice_len = PyMem_Calloc((size_t)count + 1, sizeof(*n->choice_len));
    n->choice_int = PyMem_Calloc((size_t)count + 1, sizeof(*n->choice_int));
    n->choice_double = PyMem_Calloc((size_t)count + 1, sizeof(*n->choice_double));
    if (!n->choice_text || !n->choice_len || !n->choice_int || !n->choice_double) {
        PyErr_NoMemory();
        return PYERR;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *c = PyTuple_GET_ITEM(choices, i);
        if (PyBytes_Check(c)) {
            n->choice_text[n->nchoices] = (const uint8_t *)PyBytes_AS_STRING(c);
            n->choice_len[n->nchoices++] = PyBytes_GET_SIZE(c);
        } else if (PyBool_Check(c)) {
            n->choice_bool[c == Py_True] = 1;
        } else if (PyLong_Check(c)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(c, &overflow);
            if (!overflow) { /* a choice past int64 equals no value of a column */
                n->choice_double[n->nchoices] = (double)v;
                n->choice_int[n->nchoices++] = v;
            }
        } else if (PyFloat_Check(c)) {
            n->choice_double[n->nchoices++] = PyFloat_AS_DOUBLE(c);
        } else {
            PyErr_SetString(PyExc_TypeError, "a choice must be bytes, bool, int or float");
            return PYERR;
        }
    }
    return OK;
}

/* (kind, element_nullable, precision, scale, choices, child, fields); fields: tuple of
 * (key bytes, node, none_ok, default kind, default bson document bytes or None) */
static Node *node_parse(PyObject *plan, PyObject *keep) {
    Node *n = PyMem_Calloc(1, sizeof(Node));
    if (n == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *choices, *child, *fields;
    if (!PyArg_ParseTuple(plan, "iiiiOOO:plan", &n->kind, &n->element_nullable, &n->precision, &n->scale, &choices,
                          &child, &fields)) {
        goto fail;
    }
    if (choices != Py_None && parse_choices(n, choices) < 0) {
        goto fail;
    }
    if (n->kind == K_LIST || n->kind == K_MAP) {
        n->child = node_parse(child, keep);
        if (n->child == NULL) {
            goto fail;
        }
        if (n->kind == K_MAP) {
            n->keys = PyMem_Calloc(1, sizeof(Node));
            if (n->keys == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            n->keys->kind = K_STRING;
            if (node_start(n->keys) < 0) {
                goto fail;
            }
        }
    }
    if (n->kind == K_STRUCT) {
        if (!PyTuple_Check(fields)) {
            PyErr_SetString(PyExc_TypeError, "struct fields must be a tuple");
            goto fail;
        }
        n->nfields = PyTuple_GET_SIZE(fields);
        n->fields = PyMem_Calloc((size_t)(n->nfields ? n->nfields : 1), sizeof(StructField));
        if (n->fields == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            StructField *f = &n->fields[i];
            PyObject *key, *node, *fallback_doc;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "SOiiO:field", &key, &node, &f->none_ok,
                                  &f->default_kind, &fallback_doc)) {
                goto fail;
            }
            f->key = (const uint8_t *)PyBytes_AS_STRING(key);
            f->key_len = PyBytes_GET_SIZE(key);
            f->node = node_parse(node, keep);
            if (f->node == NULL) {
                goto fail;
            }
            if (f->default_kind == D_BSON) {
                /* {"v": default}: the value starts after the type byte and "v\0" */
                if (!PyBytes_Check(fallback_doc) || PyBytes_GET_SIZE(fallback_doc) < 9) {
                    PyErr_SetString(PyExc_TypeError, "a default must be a BSON document {'v': value}");
                    goto fail;
                }
                const uint8_t *doc = (const uint8_t *)PyBytes_AS_STRING(fallback_doc);
                f->default_type = doc[4];
                f->default_value = doc + 7;
                f->default_avail = PyBytes_GET_SIZE(fallback_doc) - 8;
            }
        }
    }
    if (node_start(n) < 0) {
        goto fail;
    }
    return n;
fail:
    node_free(n);
    return NULL;
}

static inline int bit_append(Buf *b, Py_ssize_t index, int set) {
    if (index % 8 == 0) {
        if (reserve(b, 1) < 0) {
            return PYERR;
        }
        b->data[b->len++] = 0;
    }
    if (set) {
        b->data[index / 8] |= (char)(1u << (index % 8));
    }
    return OK;
}

static inline int end_offsets(Ctx *ctx, Node *n, Py_ssize_t end) {
    if (end > INT32_MAX) {
        return fallback(ctx, "a column of more than 2 GiB");
    }
    int32_t v = (int32_t)end;
    if (reserve(&n->offsets, 4) < 0) {
        return PYERR;
    }
    put(&n->offsets, (const char *)&v, 4);
    return OK;
}

static int fixed_width(int kind) {
    switch (kind) {
    case K_INT8:
    case K_BOOL:
        return 1;
    case K_INT16:
        return 2;
    case K_INT32:
    case K_FLOAT:
    case K_DATE:
        return 4;
    case K_DECIMAL:
        return 16;
    default:
        return 8;
    }
}

/* A row: validity bit, then the kind's own part of a null. */
static int node_null(Ctx *ctx, Node *n) {
    if (bit_append(&n->validity, n->count, 0) < 0) {
        return PYERR;
    }
    n->count++;
    n->nulls++;
    switch (n->kind) {
    case K_STRING:
    case K_UUID:
    case K_JSON:
    case K_BINARY:
        return end_offsets(ctx, n, n->data.len);
    case K_LIST:
    case K_MAP:
        return end_offsets(ctx, n, n->child->count);
    case K_STRUCT:
        if (n->nulls == n->count) {
            n->leading_nulls++;
            return OK;
        }
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            int rc = node_null(ctx, n->fields[i].node);
            if (rc < 0) {
                return rc;
            }
        }
        return OK;
    case K_BOOL:
        return bit_append(&n->values, n->count - 1, 0);
    default: {
        int width = fixed_width(n->kind);
        if (reserve(&n->values, width) < 0) {
            return PYERR;
        }
        memset(n->values.data + n->values.len, 0, (size_t)width);
        n->values.len += width;
        return OK;
    }
    }
}

static int misfit(Ctx *ctx) {
    return fallback(ctx, "a value that does not fit the schema (the Python path reports it)");
}

static int node_value(Writer *w, Node *n, uint8_t t, const uint8_t *p, Py_ssize_t avail, Py_ssize_t *used,
                      int depth);

static int choice_text(const Node *n, const uint8_t *p, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < n->nchoices; i++) {
        if (n->choice_text[i] != NULL && n->choice_len[i] == len && memcmp(n->choice_text[i], p, (size_t)len) == 0) {
            return 1;
        }
    }
    return 0;
}

static int choice_int(const Node *n, int64_t v) {
    for (Py_ssize_t i = 0; i < n->nchoices; i++) {
        if (n->choice_text[i] == NULL && n->choice_int[i] == v && n->choice_double[i] == (double)v) {
            return 1;
        }
    }
    return 0;
}

/* a double column's converted value against int or float choices: Python's == */
static int choice_double(const Node *n, double d) {
    for (Py_ssize_t i = 0; i < n->nchoices; i++) {
        if (n->choice_text[i] == NULL && n->choice_double[i] == d) {
            return 1;
        }
    }
    return 0;
}

/* The number an integral BSON value (int32, int64, or a double with an integral value) holds,
 * in [low, high); 0 when it does not fit. */
static int integral(uint8_t t, const uint8_t *p, Py_ssize_t avail, int64_t low, int64_t high, int64_t *out,
                    Py_ssize_t *used) {
    if (t == 0x10 && avail >= 4) {
        *out = (int32_t)rd32(p);
        *used = 4;
    } else if (t == 0x12 && avail >= 8) {
        *out = (int64_t)rd64(p);
        *used = 8;
    } else if (t == 0x01 && avail >= 8) {
        uint64_t bits = rd64(p);
        double d;
        memcpy(&d, &bits, 8);
        /* float.is_integer(), then the int range */
        if (!(d == floor(d)) || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
            return 0;
        }
        *out = (int64_t)d;
        *used = 8;
    } else {
        return 0;
    }
    if (*out < low || (high != 0 && *out >= high)) {
        return 0;
    }
    return 1;
}

static int struct_value(Writer *w, Node *n, const uint8_t *p, Py_ssize_t size, int depth);

static int node_value(Writer *w, Node *n, uint8_t t, const uint8_t *p, Py_ssize_t avail, Py_ssize_t *used,
                      int depth) {
    Ctx *ctx = w->ctx;
    int rc;
    Py_ssize_t text;
    if (t == 0x0A || t == 0x06) {
        *used = 0;
        return node_null(ctx, n);
    }
    if (depth > MAX_DEPTH) {
        return fallback(ctx, "documents nested too deeply");
    }
    switch (n->kind) {
    case K_JSON:
        rc = write_value(w, &n->data, t, p, avail, used, depth);
        if (rc < 0) {
            return rc;
        }
        rc = end_offsets(ctx, n, n->data.len);
        break;
    case K_STRING:
        if (t == 0x02 || t == 0x0E) {
            *used = string_value(p, avail, &text);
            if (*used < 0 || !utf8_valid(ctx, p + 4, text)) {
                return fallback(ctx, "a malformed string");
            }
            if (n->has_choices && !choice_text(n, p + 4, text)) {
                return misfit(ctx);
            }
            if (reserve(&n->data, text) < 0) {
                return PYERR;
            }
            put(&n->data, (const char *)p + 4, text);
        } else if (t == 0x07 && avail >= 12) {
            if (n->has_choices) {
                return fallback(ctx, "an ObjectId for a field with choices (converted in Python)");
            }
            if (reserve(&n->data, 24) < 0) {
                return PYERR;
            }
            put_hex12(&n->data, p);
            *used = 12;
        } else {
            return misfit(ctx);
        }
        rc = end_offsets(ctx, n, n->data.len);
        break;
    case K_UUID:
        if (t != 0x05 || avail < 5) {
            return t == 0x02 ? fallback(ctx, "UUID text (converted in Python)") : misfit(ctx);
        }
        {
            Py_ssize_t len = (Py_ssize_t)rd32(p);
            if (len > avail - 5 || p[4] != 4 || len != 16) {
                return misfit(ctx);
            }
            if (reserve(&n->data, 36) < 0) {
                return PYERR;
            }
            for (int i = 0; i < 16; i++) {
                if (i == 4 || i == 6 || i == 8 || i == 10) {
                    put_char(&n->data, '-');
                }
                put_char(&n->data, HEX[p[5 + i] >> 4]);
                put_char(&n->data, HEX[p[5 + i] & 15]);
            }
            *used = 5 + len;
        }
        rc = end_offsets(ctx, n, n->data.len);
        break;
    case K_BINARY:
        if (t != 0x05 || avail < 5) {
            return misfit(ctx);
        }
        {
            Py_ssize_t len = (Py_ssize_t)rd32(p);
            if (len > avail - 5 || p[4] == 2) {
                return fallback(ctx, "binary subtype 2 (converted in Python)");
            }
            if (reserve(&n->data, len) < 0) {
                return PYERR;
            }
            put(&n->data, (const char *)p + 5, len);
            *used = 5 + len;
        }
        rc = end_offsets(ctx, n, n->data.len);
        break;
    case K_INT8:
    case K_INT16:
    case K_INT32:
    case K_INT64: {
        static const int64_t LOW[] = {-128, -32768, -2147483648LL, INT64_MIN};
        static const int64_t HIGH[] = {128, 32768, 2147483648LL, 0};
        int which = n->kind - K_INT8;
        int64_t v;
        if (!integral(t, p, avail, LOW[which], HIGH[which], &v, used)) {
            return misfit(ctx);
        }
        if (n->has_choices && !choice_int(n, v)) {
            return misfit(ctx);
        }
        int width = fixed_width(n->kind);
        if (reserve(&n->values, 8) < 0) {
            return PYERR;
        }
        int8_t v8 = (int8_t)v;
        int16_t v16 = (int16_t)v;
        int32_t v32 = (int32_t)v;
        const void *src = width == 1 ? (const void *)&v8 : width == 2 ? (const void *)&v16
                          : width == 4 ? (const void *)&v32 : (const void *)&v;
        put(&n->values, (const char *)src, width);
        rc = OK;
        break;
    }
    case K_DOUBLE:
    case K_FLOAT: {
        double d;
        if (t == 0x01 && avail >= 8) {
            uint64_t bits = rd64(p);
            memcpy(&d, &bits, 8);
            *used = 8;
        } else if (t == 0x10 && avail >= 4) {
            d = (double)(int32_t)rd32(p);
            *used = 4;
        } else if (t == 0x12 && avail >= 8) {
            int64_t v = (int64_t)rd64(p);
            d = (double)v;
            /* double: only an int with an exact double value fits */
            if (n->kind == K_DOUBLE &&
                !(d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (int64_t)d == v)) {
                return misfit(ctx);
            }
            *used = 8;
        } else {
            return misfit(ctx);
        }
        if (n->has_choices && !choice_double(n, d)) {
            return misfit(ctx);
        }
        if (reserve(&n->values, 8) < 0) {
            return PYERR;
        }
        if (n->kind == K_FLOAT) {
            float f = (float)d;
            put(&n->values, (const char *)&f, 4);
        } else {
            put(&n->values, (const char *)&d, 8);
        }
        rc = OK;
        break;
    }
    case K_BOOL:
        if (t != 0x08 || avail < 1 || p[0] > 1) {
            return misfit(ctx);
        }
        if (n->has_choices && !n->choice_bool[p[0]]) {
            return misfit(ctx);
        }
        rc = bit_append(&n->values, n->count, p[0]);
        *used = 1;
        break;
    case K_TIMESTAMP:
    case K_TIMESTAMP_NTZ:
    case K_DATE: {
        if (t != 0x09 || avail < 8) {
            return misfit(ctx);
        }
        int64_t ms = (int64_t)rd64(p);
        if (ms < MIN_DATETIME_MS || ms > MAX_DATETIME_MS) {
            return misfit(ctx); /* a DatetimeMS, not a datetime */
        }
        if (reserve(&n->values, 8) < 0) {
            return PYERR;
        }
        if (n->kind == K_DATE) {
            int64_t days = ms >= 0 ? ms / 86400000 : -((-ms + 86399999) / 86400000);
            if (ms - days * 86400000 != 0) {
                return misfit(ctx);
            }
            int32_t d32 = (int32_t)days;
            put(&n->values, (const char *)&d32, 4);
        } else {
            int64_t us = ms * 1000;
            put(&n->values, (const char *)&us, 8);
        }
        *used = 8;
        rc = OK;
        break;
    }
    case K_DECIMAL: {
        __int128 number;
        if (t == 0x10 || t == 0x12) {
            int64_t v;
            if (!integral(t, p, avail, INT64_MIN, 0, &v, used)) {
                return misfit(ctx);
            }
            /* |v| * 10**scale < 10**precision, checked before scaling so nothing overflows */
            __int128 whole = 1;
            for (int i = 0; i < n->precision - n->scale; i++) {
                whole *= 10;
            }
            if (!(-whole < v && v < whole)) {
                return misfit(ctx);
            }
            number = v;
            for (int i = 0; i < n->scale; i++) {
                number *= 10;
            }
        } else if (t == 0x13 && avail >= 16) {
            uint64_t low = rd64(p), high = rd64(p + 8);
            if ((high & 0x6000000000000000ULL) == 0x6000000000000000ULL) {
                return fallback(ctx, "a special or non-canonical Decimal128 (converted in Python)");
            }
            int shift = (int)((high >> 49) & 0x3FFF) - 6176 + n->scale;
            unsigned __int128 coefficient = ((unsigned __int128)(high & ((1ULL << 49) - 1)) << 64) | low;
            const unsigned __int128 max_coefficient =
                (unsigned __int128)999999999999999ULL * 10000000000000000000ULL + 9999999999999999999ULL;
            if (coefficient > max_coefficient) {
                coefficient = 0; /* as bson reads a non-canonical coefficient */
            }
            if (shift >= 0) {
                if (coefficient != 0 && shift > 38) {
                    return misfit(ctx);
                }
                /* 10**37: one more digit reaches 10**38, past every decimal(p,s) */
                const unsigned __int128 ten37 = (unsigned __int128)1000000000000000000ULL * 10000000000000000000ULL;
                for (int i = 0; i < shift && coefficient != 0; i++) {
                    if (coefficient >= ten37) {
                        return misfit(ctx);
                    }
                    coefficient *= 10;
                }
            } else {
                for (int i = 0; i < -shift && coefficient != 0; i++) {
                    if (coefficient % 10 != 0) {
                        return misfit(ctx);
                    }
                    coefficient /= 10;
                }
            }
            number = (__int128)coefficient;
            if (high >> 63) {
                number = -number;
            }
            *used = 16;
        } else if (t == 0x01) {
            return fallback(ctx, "a double for a decimal column (converted in Python)");
        } else {
            return misfit(ctx);
        }
        __int128 limit = 1;
        for (int i = 0; i < n->precision; i++) {
            limit *= 10;
        }
        if (!(-limit < number && number < limit)) {
            return misfit(ctx);
        }
        if (reserve(&n->values, 16) < 0) {
            return PYERR;
        }
        put(&n->values, (const char *)&number, 16);
        rc = OK;
        break;
    }
    case K_LIST: {
        if (t != 0x04) {
            return misfit(ctx);
        }
        Py_ssize_t size = doc_size(p, avail);
        if (size < 0) {
            return fallback(ctx, "a malformed array");
        }
        const uint8_t *q = p + 4, *last = p + size - 1;
        while (q < last) {
            uint8_t et = *q++;
            const uint8_t *nul = name_end(q, last);
            if (nul == NULL) {
                return fallback(ctx, "a malformed field name");
            }
            q = nul + 1;
            if ((et == 0x0A || et == 0x06) && !n->element_nullable) {
                return misfit(ctx);
            }
            Py_ssize_t element;
            rc = node_value(w, n->child, et, q, last - q, &element, depth + 1);
            if (rc < 0) {
                return rc;
            }
            q += element;
        }
        *used = size;
        rc = end_offsets(ctx, n, n->child->count);
        break;
    }
    case K_MAP: {
        if (t != 0x03) {
            return misfit(ctx);
        }
        Py_ssize_t size = doc_size(p, avail);
        if (size < 0) {
            return fallback(ctx, "a malformed document");
        }
        Py_ssize_t first_key = w->keys.len;
        const uint8_t *q = p + 4, *last = p + size - 1;
        while (q < last) {
            uint8_t et = *q++;
            const uint8_t *nul = name_end(q, last);
            if (nul == NULL) {
                return fallback(ctx, "a malformed field name");
            }
            Py_ssize_t key_len = nul - q;
            if (!utf8_valid(ctx, q, key_len)) {
                return fallback(ctx, "invalid UTF-8 in a field name");
            }
            if (key_len == 4 && memcmp(q, "$ref", 4) == 0) {
                return fallback(ctx, "a document with a $ref key (bson may decode it as a DBRef)");
            }
            if (keys_push(&w->keys, q, key_len) < 0 || reserve(&n->keys->data, key_len) < 0) {
                return PYERR;
            }
            put(&n->keys->data, (const char *)q, key_len);
            n->keys->count++;
            if ((rc = end_offsets(ctx, n->keys, n->keys->data.len)) < 0) {
                return rc;
            }
            q = nul + 1;
            if ((et == 0x0A || et == 0x06) && !n->element_nullable) {
                return misfit(ctx);
            }
            Py_ssize_t element;
            rc = node_value(w, n->child, et, q, last - q, &element, depth + 1);
            if (rc < 0) {
                return rc;
            }
            q += element;
        }
        if (has_duplicates(w->keys.keys + first_key, w->keys.len - first_key)) {
            return fallback(ctx, "a document with a repeated field name");
        }
        w->keys.len = first_key;
        *used = size;
        rc = end_offsets(ctx, n, n->child->count);
        break;
    }
    case K_STRUCT: {
        if (t != 0x03) {
            return misfit(ctx);
        }
        Py_ssize_t size = doc_size(p, avail);
        if (size < 0) {
            return fallback(ctx, "a malformed document");
        }
        rc = struct_value(w, n, p, size, depth);
        if (rc < 0) {
            return rc;
        }
        *used = size;
        return OK; /* struct_value wrote the validity bit */
    }
    default:
        return fallback(ctx, "a column kind converted in Python");
    }
    if (rc < 0) {
        return rc;
    }
    if (bit_append(&n->validity, n->count, 1) < 0) {
        return PYERR;
    }
    n->count++;
    return OK;
}

#define MAX_STRUCT_FIELDS 64

/* One document into a struct row: each field from its key's last occurrence (as in a decoded
 * dict), every other element validated. */
static int struct_value(Writer *w, Node *n, const uint8_t *p, Py_ssize_t size, int depth) {
    Ctx *ctx = w->ctx;
    for (; n->leading_nulls > 0; n->leading_nulls--) {
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            int rc = node_null(ctx, n->fields[i].node);
            if (rc < 0) {
                return rc;
            }
        }
    }
    const uint8_t *found[MAX_STRUCT_FIELDS];
    Py_ssize_t found_avail[MAX_STRUCT_FIELDS];
    uint8_t found_type[MAX_STRUCT_FIELDS];
    if (n->nfields > MAX_STRUCT_FIELDS) {
        return fallback(ctx, "a struct of more than 64 fields (converted in Python)");
    }
    memset(found_type, 0, sizeof(found_type));
    const uint8_t *q = p + 4, *last = p + size - 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        if (nul == NULL) {
            return fallback(ctx, "a malformed field name");
        }
        Py_ssize_t key_len = nul - q;
        if (!utf8_valid(ctx, q, key_len)) {
            return fallback(ctx, "invalid UTF-8 in a field name");
        }
        if (key_len == 4 && memcmp(q, "$ref", 4) == 0) {
            return fallback(ctx, "a document with a $ref key (bson may decode it as a DBRef)");
        }
        Py_ssize_t index = -1;
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            if (n->fields[i].key_len == key_len && (key_len == 0 || n->fields[i].key[0] == q[0]) &&
                memcmp(n->fields[i].key, q, (size_t)key_len) == 0) {
                index = i;
                break;
            }
        }
        if (index < 0 && ctx->closed) {
            return fallback(ctx, "a field the schema does not name (rescued in Python)");
        }
        q = nul + 1;
        Py_ssize_t used;
        /* a field's value is checked when it is converted; an earlier duplicate, here */
        int rc = validate_value(ctx, t, q, last - q, &used, depth, index >= 0 ? 2 : 0);
        if (rc < 0) {
            return rc;
        }
        if (index >= 0) {
            if (found_type[index] != 0) {
                Py_ssize_t earlier;
                rc = validate_value(ctx, found_type[index], found[index], found_avail[index], &earlier, depth, 0);
                if (rc < 0) {
                    return rc;
                }
            }
            found_type[index] = t;
            found[index] = q;
            found_avail[index] = last - q;
        }
        q += used;
    }
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        StructField *f = &n->fields[i];
        uint8_t t = found_type[i];
        const uint8_t *value = found[i];
        Py_ssize_t avail = found_avail[i];
        if (t == 0) {
            switch (f->default_kind) {
            case D_BSON:
                t = f->default_type;
                value = f->default_value;
                avail = f->default_avail;
                break;
            case D_PYTHON:
                return fallback(ctx, "a missing field whose default the Python path computes");
            case D_NULL:
                t = 0x0A;
                break;
            default:
                if (!f->none_ok) {
                    return misfit(ctx);
                }
                t = 0x0A;
            }
        } else if ((t == 0x0A || t == 0x06) && !f->none_ok) {
            return misfit(ctx);
        }
        Py_ssize_t used;
        const uint8_t *event_end = ctx->end;
        if (value == f->default_value && value != NULL) {
            ctx->end = value + avail + 1; /* reading the default's own document */
        }
        int rc = node_value(w, f->node, t, value, avail, &used, depth + 1);
        ctx->end = event_end;
        if (rc < 0) {
            return rc;
        }
    }
    if (bit_append(&n->validity, n->count, 1) < 0) {
        return PYERR;
    }
    n->count++;
    return OK;
}

/* (validity or None, null count, length, buffers (values, offsets, data: those the kind has),
 * children) */
static PyObject *node_result(Node *n) {
    PyObject *validity;
    if (n->nulls == 0) {
        validity = Py_None;
        Py_INCREF(validity);
    } else if ((validity = buf_finish(&n->validity)) == NULL) {
        return NULL;
    }
    PyObject *buffers = NULL, *children = NULL;
    switch (n->kind) {
    case K_STRING:
    case K_UUID:
    case K_JSON:
    case K_BINARY:
        buffers = Py_BuildValue("(NN)", buf_finish(&n->offsets), buf_finish(&n->data));
        children = PyTuple_New(0);
        break;
    case K_LIST:
        buffers = Py_BuildValue("(N)", buf_finish(&n->offsets));
        children = Py_BuildValue("(N)", node_result(n->child));
        break;
    case K_MAP:
        buffers = Py_BuildValue("(N)", buf_finish(&n->offsets));
        children = Py_BuildValue("(NN)", node_result(n->keys), node_result(n->child));
        break;
    case K_STRUCT:
        buffers = PyTuple_New(0);
        children = PyTuple_New(n->nfields);
        if (children != NULL) {
            for (Py_ssize_t i = 0; i < n->nfields; i++) {
                PyObject *child = node_result(n->fields[i].node);
                if (child == NULL) {
                    Py_CLEAR(children);
                    break;
                }
                PyTuple_SET_ITEM(children, i, child);
            }
        }
        break;
    default:
        buffers = Py_BuildValue("(N)", buf_finish(&n->values));
        children = PyTuple_New(0);
    }
    return Py_BuildValue("(NnnNN)", validity, n->nulls, n->count, buffers, children);
}

/* ---------------------------------------------------------------------------------------- */
/* One change event */

typedef struct {
    uint8_t type; /* 0: absent */
    const uint8_t *value;
    Py_ssize_t avail;
} Field;

enum {
    F_ID,
    F_OPERATION,
    F_CLUSTER_TIME,
    F_WALL_TIME,
    F_NS,
    F_TO,
    F_DOCUMENT_KEY,
    F_UPDATE,
    F_FULL,
    F_BEFORE,
    F_COUNT,
};

static int event_field(const uint8_t *key, Py_ssize_t len) {
    switch (len) {
    case 2:
        if (memcmp(key, "ns", 2) == 0) {
            return F_NS;
        }
        return memcmp(key, "to", 2) == 0 ? F_TO : -1;
    case 3:
        return memcmp(key, "_id", 3) == 0 ? F_ID : -1;
    case 8:
        return memcmp(key, "wallTime", 8) == 0 ? F_WALL_TIME : -1;
    case 11:
        if (memcmp(key, "clusterTime", 11) == 0) {
            return F_CLUSTER_TIME;
        }
        return memcmp(key, "documentKey", 11) == 0 ? F_DOCUMENT_KEY : -1;
    case 12:
        return memcmp(key, "fullDocument", 12) == 0 ? F_FULL : -1;
    case 13:
        return memcmp(key, "operationType", 13) == 0 ? F_OPERATION : -1;
    case 17:
        return memcmp(key, "updateDescription", 17) == 0 ? F_UPDATE : -1;
    case 24:
        return memcmp(key, "fullDocumentBeforeChange", 24) == 0 ? F_BEFORE : -1;
    default:
        return -1;
    }
}

/* Walks the elements of the document at p (size bytes, checked): each field `which` knows
 * lands in fields[index], the last one winning as in a decoded dict. Every other element is
 * validated here; so are the known ones, except documents and arrays of the fields in
 * `written` (a bit per index), which the JSON writer validates as it writes them (an earlier
 * duplicate of one of those, which nobody writes, is validated here). */
static int read_fields(Ctx *ctx, const uint8_t *p, Py_ssize_t size, int depth,
                       int (*which)(const uint8_t *, Py_ssize_t), Field *fields, unsigned written) {
    const uint8_t *q = p + 4, *last = p + size - 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        if (nul == NULL) {
            return fallback(ctx, "a malformed field name");
        }
        Py_ssize_t key_len = nul - q;
        if (!utf8_valid(ctx, q, key_len)) {
            return fallback(ctx, "invalid UTF-8 in a field name");
        }
        if (depth > 0 && key_len == 4 && memcmp(q, "$ref", 4) == 0) {
            return fallback(ctx, "a document with a $ref key (bson may decode it as a DBRef)");
        }
        int index = which(q, key_len);
        int deferred = index >= 0 && ((written >> index) & 1);
        q = nul + 1;
        Py_ssize_t used;
        int rc = validate_value(ctx, t, q, last - q, &used, depth, deferred);
        if (rc < 0) {
            return rc;
        }
        if (index >= 0) {
            Field *f = &fields[index];
            if (deferred && f->type != 0) {
                Py_ssize_t earlier;
                rc = validate_value(ctx, f->type, f->value, f->avail, &earlier, depth, 0);
                if (rc < 0) {
                    return rc;
                }
            }
            f->type = t;
            f->value = q;
            f->avail = last - q;
        }
        q += used;
    }
    return OK;
}

static int data_field(const uint8_t *key, Py_ssize_t len) { return (len == 5 && memcmp(key, "_data", 5) == 0) ? 0 : -1; }

static int ns_field(const uint8_t *key, Py_ssize_t len) {
    if (len == 2 && memcmp(key, "db", 2) == 0) {
        return 0;
    }
    return (len == 4 && memcmp(key, "coll", 4) == 0) ? 1 : -1;
}

static int update_field(const uint8_t *key, Py_ssize_t len) {
    if (len == 13 && memcmp(key, "updatedFields", 13) == 0) {
        return 0;
    }
    if (len == 13 && memcmp(key, "removedFields", 13) == 0) {
        return 1;
    }
    return (len == 15 && memcmp(key, "truncatedArrays", 15) == 0) ? 2 : -1;
}

static int truncation_field(const uint8_t *key, Py_ssize_t len) {
    if (len == 5 && memcmp(key, "field", 5) == 0) {
        return 0;
    }
    return (len == 7 && memcmp(key, "newSize", 7) == 0) ? 1 : -1;
}

typedef struct {
    StringColumn id, operation, database, collection, to_database, to_collection, document_key, full, before,
        updated;
    Int64Column cluster_time, cluster_increment, wall_time;
    StringListColumn removed;
    TruncationsColumn truncated;
    Node *typed_full, *typed_before; /* NULL: Extended JSON documents */
} Table;

/* A string-or-null field (str or symbol in bson) into a string column. */
static int put_text_field(Ctx *ctx, StringColumn *c, const Field *f, const char *what) {
    if (f->type == 0 || f->type == 0x0A || f->type == 0x06) {
        return string_null(ctx, c);
    }
    if (f->type != 0x02 && f->type != 0x0E) {
        return fallback(ctx, what);
    }
    Py_ssize_t text = 0;
    if (string_value(f->value, f->avail, &text) < 0) { /* validated by read_fields */
        return fallback(ctx, "a malformed string");
    }
    if (reserve(&c->data, text) < 0) {
        return PYERR;
    }
    put(&c->data, (const char *)f->value + 4, text);
    return string_end_row(ctx, c);
}

/* Extended JSON of a field into a string column; absent or null is a null row. */
static int put_json_field(Writer *w, StringColumn *c, const Field *f, int null_text) {
    if (f->type == 0 || f->type == 0x0A || f->type == 0x06) {
        if (!null_text) {
            return string_null(w->ctx, c);
        }
        if (reserve(&c->data, 4) < 0) {
            return PYERR;
        }
        PUT_LITERAL(&c->data, "null");
        return string_end_row(w->ctx, c);
    }
    Py_ssize_t used;
    int rc = write_value(w, &c->data, f->type, f->value, f->avail, &used, 1);
    if (rc < 0) {
        return rc;
    }
    return string_end_row(w->ctx, c);
}

/* A typed full document: a struct row, null when absent or null. */
static int put_typed_field(Writer *w, Node *node, const Field *f) {
    if (f->type == 0 || f->type == 0x0A || f->type == 0x06) {
        return node_null(w->ctx, node);
    }
    if (f->type != 0x03) {
        return misfit(w->ctx);
    }
    Py_ssize_t used;
    return node_value(w, node, f->type, f->value, f->avail, &used, 1);
}

static void list_null(StringListColumn *c) {
    StringColumn *lists = &c->lists;
    lists->validity[lists->count / 8] &= (uint8_t)~(1u << (lists->count % 8));
    lists->nulls++;
    lists->offsets[++lists->count] = (int32_t)c->elements;
}

/* Ends the current list row (whose elements are already written). */
static inline void list_end_row(StringListColumn *c) { c->lists.offsets[++c->lists.count] = (int32_t)c->elements; }

/* Appends the string value at p (validated by read_fields) as an element of the current row. */
static int list_put_string(Ctx *ctx, StringListColumn *c, const uint8_t *p, Py_ssize_t avail, Py_ssize_t *used) {
    Py_ssize_t text = 0;
    *used = string_value(p, avail, &text);
    if (*used < 0) {
        return fallback(ctx, "a malformed string");
    }
    if (reserve(&c->element_data, text) < 0 || reserve(&c->element_offsets, 4) < 0) {
        return PYERR;
    }
    put(&c->element_data, (const char *)p + 4, text);
    if (c->element_data.len > INT32_MAX || c->elements >= INT32_MAX) {
        return fallback(ctx, "an array column of more than 2 GiB");
    }
    int32_t end = (int32_t)c->element_data.len;
    put(&c->element_offsets, (const char *)&end, 4);
    c->elements++;
    return OK;
}

static int put_removed_fields(Ctx *ctx, StringListColumn *c, const Field *f) {
    if (f->type == 0 || f->type == 0x0A || f->type == 0x06) {
        list_null(c);
        return OK;
    }
    if (f->type != 0x04) {
        return fallback(ctx, "removedFields is not an array");
    }
    Py_ssize_t size = doc_size(f->value, f->avail);
    const uint8_t *q = f->value + 4, *last = f->value + size - 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        q = nul + 1; /* validated by read_fields */
        if (t != 0x02 && t != 0x0E) {
            return fallback(ctx, "removedFields holds a value that is not a string");
        }
        Py_ssize_t used;
        int rc = list_put_string(ctx, c, q, last - q, &used);
        if (rc < 0) {
            return rc;
        }
        q += used;
    }
    list_end_row(c);
    return OK;
}

/* updateDescription.truncatedArrays: an array of {field: string, newSize: 32-bit integer}
 * documents (other keys ignored, as a struct column ignores them). Any other shape is left to
 * Python, which writes null for it. */
static int put_truncated_arrays(Ctx *ctx, TruncationsColumn *c, const Field *f) {
    if (f->type == 0 || f->type == 0x0A || f->type == 0x06) {
        list_null(&c->fields);
        return OK;
    }
    if (f->type != 0x04) {
        return fallback(ctx, "truncatedArrays is not an array");
    }
    Py_ssize_t size = doc_size(f->value, f->avail);
    const uint8_t *q = f->value + 4, *last = f->value + size - 1;
    while (q < last) {
        uint8_t t = *q++;
        const uint8_t *nul = name_end(q, last);
        q = nul + 1; /* validated by read_fields */
        if (t != 0x03) {
            return fallback(ctx, "truncatedArrays holds a value that is not a document");
        }
        Py_ssize_t used = doc_size(q, last - q);
        Field parts[2];
        memset(parts, 0, sizeof(parts));
        /* validates again, for the $ref check only read_fields makes; an element sits at depth 3
         * (event > updateDescription > truncatedArrays > element) */
        int rc = read_fields(ctx, q, used, 3, truncation_field, parts, 0);
        if (rc < 0) {
            return rc;
        }
        const Field *name = &parts[0], *new_size = &parts[1];
        if (name->type != 0x02 && name->type != 0x0E) {
            return fallback(ctx, "truncatedArrays holds a field that is not a string");
        }
        int64_t n;
        if (new_size->type == 0x10) {
            n = (int32_t)rd32(new_size->value);
        } else if (new_size->type == 0x12) {
            n = (int64_t)rd64(new_size->value);
        } else {
            return fallback(ctx, "truncatedArrays holds a newSize that is not an integer");
        }
        if (n < INT32_MIN || n > INT32_MAX) {
            return fallback(ctx, "truncatedArrays holds a newSize out of the 32-bit range");
        }
        Py_ssize_t text_used;
        if ((rc = list_put_string(ctx, &c->fields, name->value, name->avail, &text_used)) < 0) {
            return rc;
        }
        if (reserve(&c->sizes, 4) < 0) {
            return PYERR;
        }
        int32_t value = (int32_t)n;
        put(&c->sizes, (const char *)&value, 4);
        q += used;
    }
    list_end_row(&c->fields);
    return OK;
}

/* A namespace document {db, coll} into two string columns: nulls when absent or null. */
static int put_namespace(Ctx *ctx, StringColumn *db, StringColumn *coll, const Field *f, const char *not_document,
                         const char *db_not_string, const char *coll_not_string) {
    Field names[2];
    memset(names, 0, sizeof(names));
    if (f->type == 0x03) {
        int rc = read_fields(ctx, f->value, doc_size(f->value, f->avail), 1, ns_field, names, 0);
        if (rc < 0) {
            return rc;
        }
    } else if (f->type != 0 && f->type != 0x0A && f->type != 0x06) {
        return fallback(ctx, not_document);
    }
    int rc = put_text_field(ctx, db, &names[0], db_not_string);
    if (rc < 0) {
        return rc;
    }
    return put_text_field(ctx, coll, &names[1], coll_not_string);
}

/* Whether operationType is "snapshot": an initial-snapshot row, the one event without a token. */
static int is_snapshot_row(const Field *operation) {
    Py_ssize_t text = 0;
    if (operation->type != 0x02 || string_value(operation->value, operation->avail, &text) < 0) {
        return 0;
    }
    return text == 8 && memcmp(operation->value + 4, "snapshot", 8) == 0;
}

static int convert_event(Writer *w, Table *table, const uint8_t *p, Py_ssize_t len) {
    Ctx *ctx = w->ctx;
    if (len < 5 || (Py_ssize_t)rd32(p) != len || p[len - 1] != 0) {
        return fallback(ctx, "not a whole BSON document");
    }
    Field fields[F_COUNT];
    memset(fields, 0, sizeof(fields));
    /* documents read further below are validated there, not twice */
    int rc = read_fields(ctx, p, len, 0, event_field, fields,
                         (1u << F_ID) | (1u << F_NS) | (1u << F_TO) | (1u << F_UPDATE) | (1u << F_DOCUMENT_KEY) |
                             (1u << F_FULL) | (1u << F_BEFORE));
    if (rc < 0) {
        return rc;
    }

    /* _id: the resume token's _data; an initial-snapshot row has none (it is not a position) */
    const Field *id = &fields[F_ID];
    if (id->type == 0 && is_snapshot_row(&fields[F_OPERATION])) {
        if ((rc = put_text_field(ctx, &table->id, id, "")) < 0) {
            return rc;
        }
    } else {
        if (id->type != 0x03) {
            return fallback(ctx, "no resume token _id document");
        }
        Field data[1];
        memset(data, 0, sizeof(data));
        rc = read_fields(ctx, id->value, doc_size(id->value, id->avail), 1, data_field, data, 0);
        if (rc < 0) {
            return rc;
        }
        if (data[0].type != 0x02 && data[0].type != 0x0E) {
            return fallback(ctx, "no resume token _id._data string");
        }
        if ((rc = put_text_field(ctx, &table->id, &data[0], "")) < 0) {
            return rc;
        }
    }
    if ((rc = put_text_field(ctx, &table->operation, &fields[F_OPERATION], "operationType is not a string")) < 0) {
        return rc;
    }

    const Field *cluster = &fields[F_CLUSTER_TIME];
    if (cluster->type == 0x11) { /* increment, then seconds: two little-endian uint32 */
        int64_put(&table->cluster_time, (int64_t)rd32(cluster->value + 4) * 1000000);
        int64_put(&table->cluster_increment, (int64_t)rd32(cluster->value));
    } else {
        int64_null(&table->cluster_time);
        int64_null(&table->cluster_increment);
    }
    const Field *wall = &fields[F_WALL_TIME];
    int64_t ms = wall->type == 0x09 ? (int64_t)rd64(wall->value) : 0;
    if (wall->type == 0x09 && ms >= MIN_DATETIME_MS && ms <= MAX_DATETIME_MS) {
        int64_put(&table->wall_time, ms * 1000);
    } else {
        int64_null(&table->wall_time);
    }

    if ((rc = put_namespace(ctx, &table->database, &table->collection, &fields[F_NS], "ns is not a document",
                            "ns.db is not a string", "ns.coll is not a string")) < 0) {
        return rc;
    }
    if ((rc = put_namespace(ctx, &table->to_database, &table->to_collection, &fields[F_TO],
                            "to is not a document", "to.db is not a string", "to.coll is not a string")) < 0) {
        return rc;
    }

    if ((rc = put_json_field(w, &table->document_key, &fields[F_DOCUMENT_KEY], 0)) < 0) {
        return rc;
    }
    if (table->typed_full != NULL) {
        if ((rc = put_typed_field(w, table->typed_full, &fields[F_FULL])) < 0 ||
            (rc = put_typed_field(w, table->typed_before, &fields[F_BEFORE])) < 0) {
            return rc;
        }
    } else {
        if ((rc = put_json_field(w, &table->full, &fields[F_FULL], 0)) < 0) {
            return rc;
        }
        if ((rc = put_json_field(w, &table->before, &fields[F_BEFORE], 0)) < 0) {
            return rc;
        }
    }

    const Field *update = &fields[F_UPDATE];
    Field parts[3];
    memset(parts, 0, sizeof(parts));
    if (update->type == 0x03) {
        rc = read_fields(ctx, update->value, doc_size(update->value, update->avail), 1, update_field, parts, 1u << 0);
        if (rc < 0) {
            return rc;
        }
        /* updateDescription without updatedFields gives the text "null", as json(None) does */
        rc = put_json_field(w, &table->updated, &parts[0], 1);
    } else if (update->type != 0 && update->type != 0x0A && update->type != 0x06) {
        return fallback(ctx, "updateDescription is not a document");
    } else {
        rc = string_null(ctx, &table->updated);
    }
    if (rc < 0 || (rc = put_removed_fields(ctx, &table->removed, &parts[1])) < 0) {
        return rc;
    }
    return put_truncated_arrays(ctx, &table->truncated, &parts[2]);
}

/* ---------------------------------------------------------------------------------------- */
/* Taking a row back */

/* An event the converter leaves to Python (a value that does not fit the schema, or one the
 * Python path converts by rules not repeated here) is taken back out of every column, which
 * may hold any part of it. Each column's state before the row follows from the number of rows
 * before it alone: offsets say where each row's data and children end. So converting records
 * nothing for rows that never need it. */

/* Sets the rows [from, to) of a preset bitmap (all valid at first) valid again; returns how
 * many were null. */
static Py_ssize_t bitmap_reset(uint8_t *bits, Py_ssize_t from, Py_ssize_t to) {
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = from; i < to; i++) {
        if (!(bits[i / 8] & (1u << (i % 8)))) {
            nulls++;
            bits[i / 8] |= (uint8_t)(1u << (i % 8));
        }
    }
    return nulls;
}

/* Cuts an appended bitmap back to `rows` bits; returns how many of the bits cut were 0. A
 * node that never writes one (a map's keys) has none to cut. */
static Py_ssize_t bits_cut(Buf *b, Py_ssize_t rows, Py_ssize_t count) {
    const uint8_t *bits = (const uint8_t *)b->data;
    Py_ssize_t zeros = 0;
    if (bits == NULL) {
        return 0;
    }
    for (Py_ssize_t i = rows; i < count; i++) {
        zeros += !(bits[i / 8] & (1u << (i % 8)));
    }
    b->len = (rows + 7) / 8;
    if (rows % 8) {
        b->data[rows / 8] &= (char)((1u << (rows % 8)) - 1);
    }
    return zeros;
}

static inline Py_ssize_t offset_at(const Buf *offsets, Py_ssize_t row) { return ((const int32_t *)offsets->data)[row]; }

static void node_rewind(Node *n, Py_ssize_t rows) {
    if (n->count > rows) {
        n->nulls -= bits_cut(&n->validity, rows, n->count);
        n->count = rows;
    } else {
        bits_cut(&n->validity, rows, rows); /* a validity byte the row may have started */
    }
    switch (n->kind) {
    case K_STRING:
    case K_UUID:
    case K_JSON:
    case K_BINARY:
        n->offsets.len = (rows + 1) * 4;
        n->data.len = offset_at(&n->offsets, rows);
        return;
    case K_LIST:
    case K_MAP:
        n->offsets.len = (rows + 1) * 4;
        node_rewind(n->child, offset_at(&n->offsets, rows));
        if (n->keys != NULL) {
            node_rewind(n->keys, offset_at(&n->offsets, rows));
        }
        return;
    case K_STRUCT: {
        /* While every row is null the children are not written (leading_nulls); once a row is
         * not, every row is. */
        Py_ssize_t children = n->nulls == rows ? 0 : rows;
        n->leading_nulls = rows - children;
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            node_rewind(n->fields[i].node, children);
        }
        return;
    }
    case K_BOOL:
        bits_cut(&n->values, rows, rows);
        return;
    default:
        n->values.len = rows * fixed_width(n->kind);
    }
}

static void string_rewind(StringColumn *c, Py_ssize_t rows) {
    if (c->count < rows) {
        return; /* a column this table does not write */
    }
    c->nulls -= bitmap_reset(c->validity, rows, c->count);
    c->count = rows;
    c->data.len = c->offsets[rows];
}

static void int64_rewind(Int64Column *c, Py_ssize_t rows) {
    c->nulls -= bitmap_reset(c->validity, rows, c->count);
    c->count = rows;
}

static void string_list_rewind(StringListColumn *c, Py_ssize_t rows) {
    StringColumn *lists = &c->lists;
    lists->nulls -= bitmap_reset(lists->validity, rows, lists->count);
    lists->count = rows;
    c->elements = lists->offsets[rows];
    c->element_offsets.len = (c->elements + 1) * 4;
    c->element_data.len = offset_at(&c->element_offsets, c->elements);
}

/* Every column back to its first `rows` rows. */
static void table_rewind(Table *t, Py_ssize_t rows) {
    StringColumn *strings[] = {&t->id,           &t->operation,     &t->database,     &t->collection,
                               &t->to_database,  &t->to_collection, &t->document_key, &t->full,
                               &t->before,       &t->updated};
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        string_rewind(strings[i], rows);
    }
    int64_rewind(&t->cluster_time, rows);
    int64_rewind(&t->cluster_increment, rows);
    int64_rewind(&t->wall_time, rows);
    string_list_rewind(&t->removed, rows);
    string_list_rewind(&t->truncated.fields, rows);
    t->truncated.sizes.len = t->truncated.fields.elements * 4;
    if (t->typed_full != NULL) {
        node_rewind(t->typed_full, rows);
        node_rewind(t->typed_before, rows);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Module */

static void string_list_free(StringListColumn *c) {
    string_column_free(&c->lists);
    buf_free(&c->element_offsets);
    buf_free(&c->element_data);
}

static void table_free(Table *t) {
    StringColumn *strings[] = {&t->id,           &t->operation,     &t->database,     &t->collection,
                               &t->to_database,  &t->to_collection, &t->document_key, &t->full,
                               &t->before,       &t->updated};
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        string_column_free(strings[i]);
    }
    int64_column_free(&t->cluster_time);
    int64_column_free(&t->cluster_increment);
    int64_column_free(&t->wall_time);
    string_list_free(&t->removed);
    string_list_free(&t->truncated.fields);
    buf_free(&t->truncated.sizes);
    node_free(t->typed_full);
    node_free(t->typed_before);
}

static int string_list_init(StringListColumn *c, Py_ssize_t rows) {
    if (string_column_init(&c->lists, rows) < 0 || reserve(&c->element_offsets, 4) < 0) {
        return PYERR;
    }
    int32_t zero = 0;
    put(&c->element_offsets, (const char *)&zero, 4);
    return OK;
}

static int table_init(Table *t, Py_ssize_t rows) {
    memset(t, 0, sizeof(*t));
    StringColumn *strings[] = {&t->id,           &t->operation,     &t->database,     &t->collection,
                               &t->to_database,  &t->to_collection, &t->document_key, &t->full,
                               &t->before,       &t->updated};
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        if (string_column_init(strings[i], rows) < 0) {
            return PYERR;
        }
    }
    if (int64_column_init(&t->cluster_time, rows) < 0 || int64_column_init(&t->cluster_increment, rows) < 0 ||
        int64_column_init(&t->wall_time, rows) < 0) {
        return PYERR;
    }
    if (string_list_init(&t->removed, rows) < 0 || string_list_init(&t->truncated.fields, rows) < 0) {
        return PYERR;
    }
    return OK;
}

/* (validity or None, null count, list offsets, elements, element offsets, element data) */
static PyObject *string_list_result(StringListColumn *c) {
    PyObject *element_offsets = buf_finish(&c->element_offsets);
    PyObject *element_data = element_offsets ? buf_finish(&c->element_data) : NULL;
    if (element_data == NULL) {
        Py_XDECREF(element_offsets);
        return NULL;
    }
    PyObject *validity = validity_or_none(&c->lists.validity_obj, c->lists.nulls);
    PyObject *offsets = c->lists.offsets_obj;
    c->lists.offsets_obj = NULL;
    return Py_BuildValue("(NnNnNN)", validity, c->lists.nulls, offsets, c->elements, element_offsets,
                         element_data);
}

/* (string_list_result of the fields, the int32 new sizes) */
static PyObject *truncated_result(TruncationsColumn *c) {
    PyObject *sizes = buf_finish(&c->sizes);
    if (sizes == NULL) {
        return NULL;
    }
    PyObject *fields = string_list_result(&c->fields);
    if (fields == NULL) {
        Py_DECREF(sizes);
        return NULL;
    }
    return Py_BuildValue("(NN)", fields, sizes);
}

/* The BSON bytes of one event, held for the whole conversion: the GIL is released while the
 * workers read them, and another thread could meanwhile replace a document's bytes (or a `raw`
 * property may build new bytes on every call, which nothing else would keep alive). Exact
 * bytes, what a RawBSONDocument holds, are held by a reference; anything else through the
 * buffer protocol. */
typedef struct {
    const uint8_t *data;
    Py_ssize_t len;
    PyObject *bytes; /* a reference to exact bytes, or NULL */
    Py_buffer view;  /* view.obj is set when the bytes came through the buffer protocol */
} Source;

/* Reads the bytes from the RawBSONDocument's private slot (through the slot's member
 * descriptor when Python passes it, else the `raw` property), bytes or any buffer. */
static int source_acquire(Source *src, PyObject *item, Py_ssize_t slot, PyObject *raw_name) {
    PyObject *raw;
    if (slot >= 0) {
        raw = *(PyObject **)((char *)item + slot);
        if (raw == NULL) {
            PyErr_SetString(PyExc_AttributeError, "RawBSONDocument without its bytes");
            return PYERR;
        }
        Py_INCREF(raw);
    } else {
        raw = PyObject_GetAttr(item, raw_name);
        if (raw == NULL) {
            return PYERR;
        }
    }
    if (PyBytes_CheckExact(raw)) {
        src->bytes = raw;
        src->data = (const uint8_t *)PyBytes_AS_STRING(raw);
        src->len = PyBytes_GET_SIZE(raw);
        return OK;
    }
    int rc = PyObject_GetBuffer(raw, &src->view, PyBUF_SIMPLE);
    Py_DECREF(raw);
    if (rc < 0) {
        return PYERR;
    }
    src->data = (const uint8_t *)src->view.buf;
    src->len = src->view.len;
    return OK;
}

static void source_release(Source *src) {
    if (src->bytes != NULL) {
        Py_CLEAR(src->bytes);
    } else if (src->view.obj != NULL) {
        PyBuffer_Release(&src->view);
    }
}

/* An event left to Python: its index in the batch, and why (a static string). */
typedef struct {
    Py_ssize_t index;
    const char *reason;
} Deferred;

/* One slice of the batch, converted by one thread into its own columns. */
typedef struct {
    Table table;
    Ctx ctx;
    Writer w;
    const Source *sources;
    Py_ssize_t start, end;
    Py_ssize_t rows; /* events converted here: the others are in `deferred` */
    Deferred *deferred;
    Py_ssize_t ndeferred;
    int rc; /* OK, or PYERR: out of memory */
    int *stop; /* set by a slice out of memory: the others need not go on */
    PyThread_type_lock done;
} Slice;

static void convert_slice(void *arg) {
    Slice *c = arg;
    c->rc = OK;
    c->rows = 0;
    for (Py_ssize_t i = c->start; i < c->end; i++) {
        if (__atomic_load_n(c->stop, __ATOMIC_RELAXED)) {
            c->rc = PYERR;
            break;
        }
        c->w.keys.len = 0;
        const Source *src = &c->sources[i];
        c->ctx.end = src->data + src->len;
        int rc = convert_event(&c->w, &c->table, src->data, src->len);
        if (rc == OK) {
            c->rows++;
            continue;
        }
        if (rc == FALLBACK) {
            table_rewind(&c->table, c->rows);
            /* `deferred` holds a place for every event of the slice */
            c->deferred[c->ndeferred].index = i;
            c->deferred[c->ndeferred].reason = c->ctx.reason;
            c->ndeferred++;
            c->ctx.reason = NULL;
            continue;
        }
        c->rc = rc;
        __atomic_store_n(c->stop, 1, __ATOMIC_RELAXED);
        break;
    }
    if (c->done != NULL) {
        PyThread_release_lock(c->done);
    }
}

/* (rows, columns, ((index, reason), ...)) */
static PyObject *slice_result(Slice *c) {
    Table *t = &c->table;
    PyObject *deferred = PyTuple_New(c->ndeferred);
    if (deferred == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < c->ndeferred; k++) {
        PyObject *one = Py_BuildValue("(ns)", c->deferred[k].index, c->deferred[k].reason);
        if (one == NULL) {
            Py_DECREF(deferred);
            return NULL;
        }
        PyTuple_SET_ITEM(deferred, k, one);
    }
    PyObject *full = t->typed_full ? node_result(t->typed_full) : string_column_result(&t->full);
    PyObject *before = t->typed_full ? node_result(t->typed_before) : string_column_result(&t->before);
    /* in EVENT_COLUMNS order (flowwarden.spark.schema) */
    return Py_BuildValue("(n(NNNNNNNNNNNNNNN)N)", c->rows, string_column_result(&t->id),
                         string_column_result(&t->operation), int64_column_result(&t->cluster_time),
                         int64_column_result(&t->cluster_increment), int64_column_result(&t->wall_time),
                         string_column_result(&t->database), string_column_result(&t->collection),
                         string_column_result(&t->to_database), string_column_result(&t->to_collection),
                         string_column_result(&t->document_key), full, before, string_column_result(&t->updated),
                         string_list_result(&t->removed), truncated_result(&t->truncated), deferred);
}

#define MAX_THREADS 16
#define MIN_EVENTS_PER_THREAD 2048

PyDoc_STRVAR(convert_doc,
             "convert(events, relaxed, raw_type, raw_slot, plan, threads, closed=False) -> list | str | None\n\n"
             "The Arrow buffers of the change-event columns of a list of RawBSONDocument events, as a\n"
             "list of (rows, columns, left) slices in event order, converted by up to `threads` threads\n"
             "without the GIL; `left` holds the (index, reason) of each event of the slice left to\n"
             "Python, which are not in its columns. A str naming the first event and the reason when\n"
             "every event is left to Python; None when not every event is a raw_type instance.\n"
             "raw_slot is the member descriptor of the document's bytes slot, or None to read the\n"
             "`raw` property. plan types full_document (see flowwarden.spark.convert.native), None: Extended JSON.\n"
             "closed: an event whose typed document has a key the plan does not name is left to Python.");

static PyObject *convert(PyObject *module, PyObject *args) {
    PyObject *events, *raw_type, *raw_slot, *plan;
    int relaxed, threads, closed = 0;
    if (!PyArg_ParseTuple(args, "O!pO!OOi|p:convert", &PyList_Type, &events, &relaxed, &PyType_Type, &raw_type,
                          &raw_slot, &plan, &threads, &closed)) {
        return NULL;
    }
    Py_ssize_t slot = -1;
    if (raw_slot != Py_None) {
        if (!Py_IS_TYPE(raw_slot, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)raw_slot)->d_member->type != T_OBJECT_EX ||
            PyDescr_TYPE(raw_slot) != (PyTypeObject *)raw_type) {
            PyErr_SetString(PyExc_TypeError, "raw_slot must be the raw_type's member descriptor of its bytes");
            return NULL;
        }
        slot = ((PyMemberDescrObject *)raw_slot)->d_member->offset;
    }
    /* A snapshot: reading `raw` may run Python code, which could change the list. */
    PyObject *items = PyList_AsTuple(events);
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t rows = PyTuple_GET_SIZE(items);
    Py_ssize_t slices = rows / MIN_EVENTS_PER_THREAD;
    if (slices > threads) {
        slices = threads;
    }
    if (slices > MAX_THREADS) {
        slices = MAX_THREADS;
    }
    if (slices < 1) {
        slices = 1;
    }

    PyObject *result = NULL;
    PyObject *raw_name = PyUnicode_InternFromString("raw");
    Source *sources = PyMem_Calloc((size_t)rows + 1, sizeof(Source));
    Slice *slice = PyMem_Calloc((size_t)slices, sizeof(Slice));
    Py_ssize_t acquired = 0;
    int stop = 0;
    Py_ssize_t s_done = 0;
    if (raw_name == NULL || sources == NULL || slice == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    /* The only pass over the event objects while holding the GIL, so it is the one part of a
     * conversion that does not run in parallel: each event and its bytes object are prefetched
     * a few events ahead, as they are rarely in the cache. */
    for (Py_ssize_t i = 0; i < rows; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (i + 16 < rows) {
            __builtin_prefetch(PyTuple_GET_ITEM(items, i + 16));
        }
        if (slot >= 0 && i + 8 < rows) {
            PyObject *ahead = PyTuple_GET_ITEM(items, i + 8);
            if (Py_IS_TYPE(ahead, (PyTypeObject *)raw_type)) {
                __builtin_prefetch(*(PyObject **)((char *)ahead + slot));
            }
        }
        if (!PyObject_TypeCheck(item, (PyTypeObject *)raw_type)) {
            result = Py_NewRef(Py_None); /* not every event is raw: nothing to convert */
            goto done;
        }
        /* The slot is read directly only from the type itself: a subclass may override `raw`. */
        Py_ssize_t item_slot = Py_IS_TYPE(item, (PyTypeObject *)raw_type) ? slot : -1;
        if (source_acquire(&sources[i], item, item_slot, raw_name) < 0) {
            goto done;
        }
        acquired = i + 1;
    }
    for (Py_ssize_t k = 0; k < slices; k++) {
        Slice *c = &slice[k];
        c->start = rows * k / slices;
        c->end = rows * (k + 1) / slices;
        c->sources = sources;
        c->stop = &stop;
        c->ctx.relaxed = relaxed;
        c->ctx.closed = closed;
        c->w.ctx = &c->ctx;
        s_done = k + 1;
        if (table_init(&c->table, c->end - c->start) < 0) {
            goto done;
        }
        c->deferred = PyMem_Malloc(sizeof(Deferred) * (size_t)(c->end - c->start + 1));
        if (c->deferred == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (plan != Py_None) {
            c->table.typed_full = node_parse(plan, NULL);
            c->table.typed_before = c->table.typed_full ? node_parse(plan, NULL) : NULL;
            if (c->table.typed_before == NULL) {
                goto done;
            }
        } else {
            /* The Extended JSON of the full documents takes about as many bytes as the events:
             * one block of that size up front spares the copies of growing to it. */
            Py_ssize_t bytes = 0;
            for (Py_ssize_t i = c->start; i < c->end; i++) {
                bytes += sources[i].len;
            }
            if (reserve(&c->table.full.data, bytes) < 0) {
                PyErr_NoMemory();
                goto done;
            }
        }
    }
    /* slices 1.. on their own threads (inline when a thread cannot start), slice 0 here */
    for (Py_ssize_t k = 1; k < slices; k++) {
        Slice *c = &slice[k];
        c->done = PyThread_allocate_lock();
        if (c->done != NULL) {
            PyThread_acquire_lock(c->done, WAIT_LOCK);
            if (PyThread_start_new_thread(convert_slice, c) == PYTHREAD_INVALID_THREAD_ID) {
                PyThread_release_lock(c->done);
                PyThread_free_lock(c->done);
                c->done = NULL;
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    convert_slice(&slice[0]);
    for (Py_ssize_t k = 1; k < slices; k++) {
        if (slice[k].done != NULL) {
            PyThread_acquire_lock(slice[k].done, WAIT_LOCK);
            PyThread_release_lock(slice[k].done);
            PyThread_free_lock(slice[k].done);
            slice[k].done = NULL;
        } else {
            convert_slice(&slice[k]);
        }
    }
    Py_END_ALLOW_THREADS

    for (Py_ssize_t k = 0; k < slices; k++) {
        if (slice[k].rc == PYERR) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* Nothing converted here (a batch of one event the Python path converts, say): the first
     * event's reason, and the whole batch goes to Python. */
    Py_ssize_t converted = 0;
    for (Py_ssize_t k = 0; k < slices; k++) {
        converted += slice[k].rows;
    }
    if (converted == 0 && rows > 0) {
        result = PyUnicode_FromFormat("event %zd: %s", slice[0].deferred[0].index, slice[0].deferred[0].reason);
        goto done;
    }
    result = PyList_New(slices);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t k = 0; k < slices; k++) {
        PyObject *one = slice_result(&slice[k]);
        if (one == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, one);
    }
done:
    if (slice != NULL) {
        for (Py_ssize_t k = 0; k < s_done; k++) {
            table_free(&slice[k].table);
            free(slice[k].w.keys.keys);
            PyMem_Free(slice[k].deferred);
        }
        PyMem_Free(slice);
    }
    if (sources != NULL) {
        for (Py_ssize_t i = 0; i < acquired; i++) {
            source_release(&sources[i]);
        }
        PyMem_Free(sources);
    }
    Py_XDECREF(raw_name);
    Py_DECREF(items);
    return result;
}

PyDoc_STRVAR(pool_doc, "pool() -> (blocks, bytes)\n\nHow many output blocks the pool keeps for reuse, and their size in bytes.");

static PyObject *pool_stats(PyObject *module, PyObject *unused) {
    Py_ssize_t blocks = 0, bytes;
    PyThread_acquire_lock(pool.lock, WAIT_LOCK);
    for (int k = 0; k < POOL_CLASSES; k++) {
        blocks += pool.count[k];
    }
    bytes = pool.bytes;
    PyThread_release_lock(pool.lock);
    return Py_BuildValue("(nn)", blocks, bytes);
}

PyDoc_STRVAR(release_memory_doc, "release_memory() -> int\n\nFrees every block the pool keeps; returns how many bytes.");

static PyObject *release_memory(PyObject *module, PyObject *unused) {
    Py_ssize_t freed;
    PyThread_acquire_lock(pool.lock, WAIT_LOCK);
    for (int k = 0; k < POOL_CLASSES; k++) {
        while (pool.count[k] > 0) {
            free(pool.blocks[k][--pool.count[k]]);
        }
    }
    freed = pool.bytes;
    pool.bytes = 0;
    PyThread_release_lock(pool.lock);
    return PyLong_FromSsize_t(freed);
}

static PyMethodDef methods[] = {
    {"convert", convert, METH_VARARGS, convert_doc},
    {"pool", pool_stats, METH_NOARGS, pool_doc},
    {"release_memory", release_memory, METH_NOARGS, release_memory_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "flowwarden.spark.convert._native",
    "Raw change-event BSON into the Arrow buffers of flowwarden's change-event table.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&NativeBufferType) < 0) {
        return NULL;
    }
    if (pool.lock == NULL && (pool.lock = PyThread_allocate_lock()) == NULL) {
        return PyErr_NoMemory();
    }
    return PyModule_Create(&module);
}
