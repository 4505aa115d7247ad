/* kvcore._native_hash: a request's chained block hashes in one call.
 *
 * The specification is BlockHasher.update in kvcore/_hashing.py; this module
 * computes the same values for the two algorithms whose inputs are the token
 * ids alone (no extra keys):
 *
 *   chain_sha256  digest_i = SHA-256(digest_{i-1} || ids of block i as
 *                 little-endian int64), 32 bytes each;
 *   chain_fast    hash_i = hash((hash_{i-1}, tuple(ids of block i))), the
 *                 interpreter's own tuple hash, computed on the packed ids
 *                 where import checked that the formulas hold (below).
 *
 * Both take (tokens, start, count, size, parent, out): the ids
 * tokens[start : start + count * size] form count blocks of size ids, parent
 * is the hash before the first of them, and the new hashes are appended to
 * the list out. They return True when they did it, and False, with nothing
 * appended and no exception set, when the input is anything but the plain
 * case: a token that is not an exact int in the signed 64-bit range (a bool,
 * a numpy integer, an out-of-range int), tokens that are not a list, a parent
 * that is not a 32-byte bytes object (sha256) or an exact int (fast), the
 * token list passed as the output too. The caller then runs the Python path,
 * which hashes what it can and raises the specification's error for what it
 * refuses, so errors need no second implementation here. The checking and
 * packing loop neither allocates nor calls Python code (exact ints only), so
 * the list cannot change under it.
 *
 * Why OpenSSL's libcrypto, through its low-level SHA256_Init/Update/Final:
 * hashlib.sha256 already runs that library's compression code (SHA-NI or
 * AVX2 chosen by OpenSSL's own CPUID dispatch), so the digests are the same
 * code's, and what costs per block in Python is the EVP layer around it (a
 * context allocated, the provider's method looked up, a bytes object per
 * concatenation), not the compression. The low-level calls skip that layer
 * but keep the tuned assembly; a self-written SHA-256 would need its own
 * SHA-NI path to match it and would be one more piece of cryptographic code
 * to trust. The low-level API is marked deprecated in OpenSSL 3 (kept
 * through the 3.x series); a libcrypto built without it, or a machine without
 * the headers, fails this optional extension's build and kvcore hashes in
 * Python, saying so once.
 */
#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

#define DIGEST 32
/* Below this many bytes to hash the interpreter lock stays held: releasing
 * and taking it back costs more than the hashing another thread could overlap. */
#define RELEASE_BYTES 16384

/* The exact int at ``item`` as int64 in *value: 1, or 0 when it is not one
 * (another type, or out of range); never an exception. */
static inline int
exact_int64(PyObject *item, int64_t *value)
{
    int overflow = 0;
    long long v;
    if (!PyLong_CheckExact(item))
        return 0;
    /* Most ids fit one digit: read them in place (the call below costs more
     * than the hashing of an id). */
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        *value = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)item);
        return 1;
    }
#else
    if (Py_SIZE(item) >= -1 && Py_SIZE(item) <= 1) {
        *value = (int64_t)Py_SIZE(item) * (int64_t)((PyLongObject *)item)->ob_digit[0];
        return 1;
    }
#endif
    v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow != 0)
        return 0;
    /* -1 is also the error value; an exact int cannot fail otherwise. */
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *value = (int64_t)v;
    return 1;
}

/* Little-endian whatever the machine's byte order (a plain store on x86). */
static inline void
put_le64(unsigned char *at, int64_t value)
{
    uint64_t u = (uint64_t)value;
    for (int i = 0; i < 8; i++)
        at[i] = (unsigned char)(u >> (8 * i));
}

/* Pack ``n`` ids from ``items`` into ``out`` (8 bytes each, out may be NULL
 * to check only): 1 when every id is an exact int64, else 0. */
static int
pack_ids(PyObject **items, Py_ssize_t n, unsigned char *out)
{
    int64_t value;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!exact_int64(items[i], &value))
            return 0;
        if (out != NULL)
            put_le64(out + 8 * i, value);
    }
    return 1;
}

typedef struct {
    PyObject *tokens;
    Py_ssize_t start, count, size;
    PyObject *parent;
    PyObject *out;
} ChainArgs;

/* Parse (tokens, start, count, size, parent, out): 1 and *a filled, 0 for
 * input the Python path must take (no exception), -1 with an exception. */
static int
parse_chain(PyObject *const *args, Py_ssize_t nargs, ChainArgs *a)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "expected (tokens, start, count, size, parent, out)");
        return -1;
    }
    a->tokens = args[0];
    a->parent = args[4];
    a->out = args[5];
    if (!PyList_CheckExact(a->tokens) || !PyList_CheckExact(a->out) || a->tokens == a->out)
        return 0;
    if ((a->start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return -1;
    if ((a->count = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred())
        return -1;
    if ((a->size = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred())
        return -1;
    if (a->start < 0 || a->count <= 0 || a->size <= 0
        || a->count > (PyList_GET_SIZE(a->tokens) - a->start) / a->size)
        return 0;
    return 1;
}

/* Append the ``count`` digests at ``digests`` to ``out`` as bytes: 0, or -1
 * with an exception and ``out`` as it was. */
static int
append_digests(PyObject *out, const unsigned char *digests, Py_ssize_t count)
{
    Py_ssize_t before = PyList_GET_SIZE(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *digest = PyBytes_FromStringAndSize((const char *)digests + DIGEST * i, DIGEST);
        if (digest == NULL || PyList_Append(out, digest) < 0) {
            Py_XDECREF(digest);
            PyList_SetSlice(out, before, PyList_GET_SIZE(out), NULL);
            return -1;
        }
        Py_DECREF(digest);
    }
    return 0;
}

/* digests[i] = SHA-256(digests[i-1] || block i of ``ids``), digests[-1] = parent. */
static void
sha256_chain(const unsigned char *parent, const unsigned char *ids, Py_ssize_t count,
             size_t step, unsigned char *digests)
{
    SHA256_CTX ctx;
    const unsigned char *previous = parent;
    for (Py_ssize_t i = 0; i < count; i++) {
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, previous, DIGEST);
        SHA256_Update(&ctx, ids + step * (size_t)i, step);
        SHA256_Final(digests + DIGEST * i, &ctx);
        previous = digests + DIGEST * i;
    }
}

static PyObject *
chain_sha256(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ChainArgs a;
    int parsed = parse_chain(args, nargs, &a);
    if (parsed <= 0)
        return parsed < 0 ? NULL : Py_NewRef(Py_False);
    if (!PyBytes_CheckExact(a.parent) || PyBytes_GET_SIZE(a.parent) != DIGEST)
        Py_RETURN_FALSE;
    Py_ssize_t n = a.count * a.size;
    size_t step = 8 * (size_t)a.size;
    unsigned char *ids = PyMem_RawMalloc(8 * (size_t)n + DIGEST * (size_t)(a.count + 1));
    if (ids == NULL)
        return PyErr_NoMemory();
    unsigned char *parent = ids + 8 * (size_t)n, *digests = parent + DIGEST;
    PyObject *result = Py_False;
    if (pack_ids(PySequence_Fast_ITEMS(a.tokens) + a.start, n, ids)) {
        /* The parent is copied: the bytes object is not used once the lock is released. */
        memcpy(parent, PyBytes_AS_STRING(a.parent), DIGEST);
        if (step * (size_t)a.count >= RELEASE_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            sha256_chain(parent, ids, a.count, step, digests);
            Py_END_ALLOW_THREADS
        }
        else {
            sha256_chain(parent, ids, a.count, step, digests);
        }
        result = append_digests(a.out, digests, a.count) < 0 ? NULL : Py_True;
    }
    PyMem_RawFree(ids);
    return Py_XNewRef(result);
}

/* -- chain_fast ------------------------------------------------------------
 *
 * The value is hash((parent, tuple(ids))), which CPython computes with its
 * tuple hash (an xxHash-style lane per item, since 3.8) over the hashes of
 * the items, an int's hash being its value modulo 2^61 - 1 with the sign
 * kept. The ids are exact int64s, so both steps are done here on the packed
 * ids: no tuple, no int object per block but its result. The module checks
 * at import that these formulas give the interpreter's own values (see
 * check_fast_formulas); where they do not (another interpreter, a 32-bit
 * hash) chain_fast builds the tuples and asks the interpreter instead. */

#if SIZEOF_PY_HASH_T == 8
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define INT_HASH_MODULUS (((uint64_t)1 << 61) - 1)

/* The hash of the Python int ``value``. */
static inline Py_hash_t
int64_hash(int64_t value)
{
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    /* 2^61 is 1 modulo 2^61 - 1: fold the top three bits onto the rest. */
    uint64_t folded = (magnitude & INT_HASH_MODULUS) + (magnitude >> 61);
    if (folded >= INT_HASH_MODULUS)
        folded -= INT_HASH_MODULUS;
    Py_hash_t hash = (Py_hash_t)folded;
    if (value < 0)
        hash = -hash;
    return hash == -1 ? -2 : hash;
}

static inline Py_uhash_t
tuple_lane(Py_uhash_t acc, Py_hash_t item_hash)
{
    acc += (Py_uhash_t)item_hash * XXPRIME_2;
    acc = (acc << 31) | (acc >> 33);
    return acc * XXPRIME_1;
}

static inline Py_hash_t
tuple_finish(Py_uhash_t acc, Py_ssize_t length)
{
    acc += (Py_uhash_t)length ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* hash((parent, tuple(ids[0:size]))) for a parent whose hash is parent_hash. */
static Py_hash_t
fast_formula(Py_hash_t parent_hash, const int64_t *ids, Py_ssize_t size)
{
    Py_uhash_t block = XXPRIME_5;
    for (Py_ssize_t i = 0; i < size; i++)
        block = tuple_lane(block, int64_hash(ids[i]));
    Py_uhash_t pair = tuple_lane(XXPRIME_5, parent_hash);
    pair = tuple_lane(pair, tuple_finish(block, size));
    return tuple_finish(pair, 2);
}
#endif

/* Whether fast_formula is the interpreter's hash here; set at import. */
static int fast_formulas_hold = 0;

/* hash((parent, tuple(items[0:size]))) as an int, or NULL with an exception. */
static PyObject *
fast_one(PyObject *parent, PyObject **items, Py_ssize_t size)
{
    PyObject *block = PyTuple_New(size);
    if (block == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < size; i++)
        PyTuple_SET_ITEM(block, i, Py_NewRef(items[i]));
    PyObject *pair = PyTuple_Pack(2, parent, block);
    Py_DECREF(block);
    if (pair == NULL)
        return NULL;
    Py_hash_t hash = PyObject_Hash(pair);
    Py_DECREF(pair);
    return hash == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(hash);
}

/* The chain through the interpreter's tuple hash: 1, or -1 with an exception
 * and ``out`` as it was. */
static int
fast_chain_by_tuples(ChainArgs *a)
{
    /* The blocks are built from a copy: an allocation below may run the
     * collector, whose finalizers could change the request's own list. */
    PyObject *copy = PyList_GetSlice(a->tokens, a->start, a->start + a->count * a->size);
    if (copy == NULL)
        return -1;
    Py_ssize_t before = PyList_GET_SIZE(a->out);
    PyObject *parent = Py_NewRef(a->parent);
    int result = 1;
    for (Py_ssize_t i = 0; i < a->count; i++) {
        PyObject *hash = fast_one(parent, PySequence_Fast_ITEMS(copy) + a->size * i, a->size);
        Py_DECREF(parent);
        parent = hash;
        if (hash == NULL || PyList_Append(a->out, hash) < 0) {
            PyList_SetSlice(a->out, before, PyList_GET_SIZE(a->out), NULL);
            result = -1;
            break;
        }
    }
    Py_XDECREF(parent);
    Py_DECREF(copy);
    return result;
}

#if SIZEOF_PY_HASH_T == 8
/* The chain through fast_formula on the packed ids: 1, 0 when an id is not
 * an exact int64 (nothing appended, no exception), or -1 with an exception
 * and ``out`` as it was. Nothing allocated runs between reading the ids and
 * the last hash, so the token list cannot change under the loop. */
static int
fast_chain_by_formula(ChainArgs *a)
{
    Py_ssize_t n = a->count * a->size;
    Py_hash_t parent_hash = PyObject_Hash(a->parent); /* an exact int: cannot fail */
    int64_t *ids = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(n + a->count));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_hash_t *hashes = (Py_hash_t *)(ids + n);
    PyObject **items = PySequence_Fast_ITEMS(a->tokens) + a->start;
    int result = 1;
    for (Py_ssize_t i = 0; i < n && result; i++)
        result = exact_int64(items[i], &ids[i]);
    for (Py_ssize_t i = 0; i < a->count && result; i++) {
        hashes[i] = fast_formula(parent_hash, ids + a->size * i, a->size);
        parent_hash = int64_hash(hashes[i]);
    }
    Py_ssize_t before = PyList_GET_SIZE(a->out);
    for (Py_ssize_t i = 0; i < a->count && result > 0; i++) {
        PyObject *hash = PyLong_FromSsize_t(hashes[i]);
        if (hash == NULL || PyList_Append(a->out, hash) < 0) {
            PyList_SetSlice(a->out, before, PyList_GET_SIZE(a->out), NULL);
            result = -1;
        }
        Py_XDECREF(hash);
    }
    PyMem_RawFree(ids);
    return result;
}
#endif

static PyObject *
chain_fast(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ChainArgs a;
    int parsed = parse_chain(args, nargs, &a);
    if (parsed <= 0)
        return parsed < 0 ? NULL : Py_NewRef(Py_False);
    /* A parent of another type could run Python code when hashed. */
    if (!PyLong_CheckExact(a.parent))
        Py_RETURN_FALSE;
    int result;
#if SIZEOF_PY_HASH_T == 8
    if (fast_formulas_hold)
        result = fast_chain_by_formula(&a);
    else
#endif
        result = pack_ids(PySequence_Fast_ITEMS(a.tokens) + a.start, a.count * a.size, NULL)
                     ? fast_chain_by_tuples(&a)
                     : 0;
    return result < 0 ? NULL : Py_NewRef(result ? Py_True : Py_False);
}

/* Set fast_formulas_hold: whether fast_formula gives the interpreter's
 * hash((parent, tuple(ids))) on samples that reach every branch of the two
 * hashes (negative ids and parents, the modulus and its neighbours, the
 * extremes of int64, one and several ids). 0, or -1 with an exception. */
static int
check_fast_formulas(void)
{
#if SIZEOF_PY_HASH_T == 8
    static const int64_t samples[] = {
        0, 1, -1, -2, 7, 511, ((int64_t)1 << 61) - 2, ((int64_t)1 << 61) - 1,
        (int64_t)1 << 61, -(((int64_t)1 << 61) - 1), INT64_MAX, INT64_MIN, 1546275796,
    };
    const Py_ssize_t count = (Py_ssize_t)(sizeof(samples) / sizeof(samples[0]));
    int holds = 1;
    for (Py_ssize_t size = 1; size <= count && holds; size += 3) {
        for (Py_ssize_t p = 0; p < count && holds; p++) {
            PyObject *parent = PyLong_FromLongLong(samples[p]);
            PyObject *ids = PyTuple_New(size);
            if (parent == NULL || ids == NULL) {
                Py_XDECREF(parent);
                Py_XDECREF(ids);
                return -1;
            }
            for (Py_ssize_t i = 0; i < size; i++)
                PyTuple_SET_ITEM(ids, i, PyLong_FromLongLong(samples[(p + i) % count]));
            int64_t values[sizeof(samples) / sizeof(samples[0])];
            for (Py_ssize_t i = 0; i < size; i++)
                values[i] = samples[(p + i) % count];
            PyObject *pair = PyTuple_Pack(2, parent, ids);
            Py_hash_t expected = pair == NULL ? -1 : PyObject_Hash(pair);
            Py_XDECREF(pair);
            Py_DECREF(ids);
            if (expected == -1 && PyErr_Occurred()) {
                Py_DECREF(parent);
                return -1;
            }
            holds = fast_formula(int64_hash(samples[p]), values, size) == expected &&
                    PyObject_Hash(parent) == int64_hash(samples[p]);
            Py_DECREF(parent);
        }
    }
    fast_formulas_hold = holds;
#endif
    return 0;
}

static PyObject *
fast_formulas_in_use(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(fast_formulas_hold);
}

static PyMethodDef native_hash_methods[] = {
    {"chain_sha256", (PyCFunction)(void (*)(void))chain_sha256, METH_FASTCALL,
     "chain_sha256(tokens, start, count, size, parent, out) -> bool\n\n"
     "Append the chained SHA-256 digests of count blocks of size token ids."},
    {"chain_fast", (PyCFunction)(void (*)(void))chain_fast, METH_FASTCALL,
     "chain_fast(tokens, start, count, size, parent, out) -> bool\n\n"
     "Append the chained hash((parent, tuple(block))) of count blocks of size token ids."},
    {"fast_formulas_in_use", fast_formulas_in_use, METH_NOARGS,
     "fast_formulas_in_use() -> bool\n\n"
     "Whether chain_fast computes the interpreter's hashes itself (checked at import)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_hash_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcore._native_hash",
    .m_doc = "A request's chained block hashes in one call (see kvcore/_hashing.py).",
    .m_size = 0,
    .m_methods = native_hash_methods,
};

PyMODINIT_FUNC
PyInit__native_hash(void)
{
    if (check_fast_formulas() < 0)
        return NULL;
    return PyModuleDef_Init(&native_hash_module);
}
