/* kvcore._native: the block pool's per-block state and loops, compiled.
 *
 * The readable specification is kvcore/_block_pool.py (the pool) and
 * kvcore/_eviction/lru.py (the "lru" free queue); kvcore/_native_pool.py puts
 * this module under the same interface. A Core holds, in flat C arrays:
 *
 *   ref[b]            the reference count of block b (int32, exported to Python
 *                     as a writable buffer: the pool's ``_ref`` is a memoryview);
 *   prev[b], next[b]  the free queue, a doubly linked list through the block
 *                     ids with a sentinel at index n (prev[b] == -1: b is not
 *                     queued); head = next[n], tail = prev[n];
 *   num_free          the pool's count of free blocks.
 *
 * The prefix map has two forms:
 *
 *   digests (bind_digests): every block hash is a bytes object of one width
 *     (the digests kvcore's "sha256" and "xxh3_128" hashers make), or with
 *     int keys an int of 64 bits (the "fast" hasher's, kept as 8 bytes); the map
 *     is a DigestTable (kvcore/_digest_table.c): the digest per block in one
 *     byte array and an open-addressing table of block ids. The map keeps no
 *     Python object per cached block (block ids' ints are kept apart, see
 *     ID_OBJECTS_MAX). The duplicates (rare) stay a Python dict per
 *     group, hash -> later blocks, and the group of each block the pool's
 *     bytearray.
 *   objects (bind): block hashes are any hashable; the map stays in the
 *     pool's Python containers (the per-block hash list, the per-group dicts
 *     hash -> block and hash -> duplicates, the group bytearray), driven
 *     through the C API.
 *
 * Transactions: while ``journal`` is a list, every operation appends
 * (undo callable, arguments) steps; replayed newest first they restore the
 * exact previous state, the queue order included. An operation that fails
 * part-way first undoes what it changed, or leaves journaled steps that do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "_digest_table.h"
#include "_native_core.h"

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int32_t *ref;
    int32_t *prev;
    int32_t *next;
    Py_ssize_t num_free;
    Py_ssize_t exports;
    Py_ssize_t stride;     /* sizeof(int32_t), the buffer's one stride */
    PyObject *journal;     /* list or None */
    PyObject *hashes;      /* list: the hash of each block, or None */
    PyObject *maps;        /* list of dicts: hash -> first cached block */
    PyObject *dups;        /* list of dicts: hash -> list of later blocks */
    PyObject *groups;      /* bytearray: the group each block was cached in */
    PyObject *double_free; /* the exception class for a second free */
    int keyed;             /* the digest form: ``map`` holds the prefix map */
    int int_keys;          /* ... with int hashes, kept as 8-byte little-endian keys */
    unsigned char key[8];  /* the key of the int hash last converted (key_digest) */
    DigestTable map;
    PyObject **id_objects;       /* the int object of each block id below num_id_slots, or NULL */
    Py_ssize_t num_id_slots;     /* min(n, ID_OBJECTS_MAX) */
    Py_ssize_t num_id_objects;   /* how many of those slots hold an object */
} Core;

/* Block ids below this keep one int object each for the core's lifetime (an
 * 8-byte slot and a 32-byte allocation an id at most, 40 MiB a pool): a table
 * handed out and freed then neither allocates nor frees an int per block.
 * Larger ids get a new int each time, as before. */
#define ID_OBJECTS_MAX ((Py_ssize_t)1 << 20)

static PyTypeObject CoreType;

/* -- the linked queue ------------------------------------------------------- */

static inline void
q_link_before(Core *self, int32_t block, int32_t at)
{
    int32_t before = self->prev[at];
    self->prev[block] = before;
    self->next[block] = at;
    self->next[before] = block;
    self->prev[at] = block;
}

static inline void
q_unlink(Core *self, int32_t block)
{
    int32_t before = self->prev[block], after = self->next[block];
    self->next[before] = after;
    self->prev[after] = before;
    self->prev[block] = -1;
    self->next[block] = -1;
}

static inline int32_t
q_sentinel(Core *self)
{
    return (int32_t)self->n;
}

/* -- helpers ---------------------------------------------------------------- */

/* The value of int ``item``: read in place when it is an exact int of one
 * machine word's worth (every block id), else PyLong_AsSsize_t (-1 with an
 * exception set for what is no int or does not fit). The per-block loops read
 * thousands of ids a call, and the call and checks of PyLong_AsSsize_t were a
 * fifth of a long hit's admission. */
static inline Py_ssize_t
int_value(PyObject *item)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(item) && PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)item);
    }
#else
    if (PyLong_CheckExact(item)) {
        Py_ssize_t size = Py_SIZE(item);
        if (size == 0) {
            return 0;
        }
        if (size == 1) {
            return (Py_ssize_t)((PyLongObject *)item)->ob_digit[0];
        }
    }
#endif
    return PyLong_AsSsize_t(item);
}

/* The block id at ``item`` (a Python int), or -1 with an exception set. */
static inline int32_t
block_of(Core *self, PyObject *item)
{
    Py_ssize_t block = int_value(item);
    if (block == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (block < 0 || block >= self->n) {
        PyErr_Format(PyExc_IndexError, "block %zd is not a block of this pool (ids 0..%zd)",
                     block, self->n - 1);
        return -1;
    }
    return (int32_t)block;
}

/* Append (self.<name>, args) to the journal; steals ``args``. */
static int
journal_append(Core *self, const char *name, PyObject *args)
{
    if (args == NULL) {
        return -1;
    }
    PyObject *method = PyObject_GetAttrString((PyObject *)self, name);
    if (method == NULL) {
        Py_DECREF(args);
        return -1;
    }
    PyObject *step = PyTuple_Pack(2, method, args);
    Py_DECREF(method);
    Py_DECREF(args);
    if (step == NULL) {
        return -1;
    }
    int failed = PyList_Append(self->journal, step);
    Py_DECREF(step);
    return failed;
}

static inline int
journaling(Core *self)
{
    return self->journal != Py_None;
}

static int
check_bound(Core *self)
{
    if (self->hashes == NULL && !self->keyed) {
        PyErr_SetString(PyExc_RuntimeError, "native pool core used before bind()");
        return -1;
    }
    return 0;
}

/* 0 if this core keeps the free queue; else -1 with an exception (a core made
 * with queue=False leaves the free blocks to its pool's policy). */
static inline int
check_queue(Core *self)
{
    if (self->next == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this core keeps no free queue (made with queue=False): its pool's "
                        "eviction policy holds the free blocks");
        return -1;
    }
    return 0;
}

static inline unsigned char
group_of(Core *self, int32_t block)
{
    return ((unsigned char *)PyByteArray_AS_STRING(self->groups))[block];
}

/* The block a dict maps to, or -1 when absent or not an int (an exception may be set). */
static inline Py_ssize_t
dict_block(PyObject *map, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(map, key);
    if (value == NULL) {
        return -1;
    }
    return PyLong_AsSsize_t(value);
}

/* -- construction ----------------------------------------------------------- */

static void
Core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    PyMem_RawFree(self->ref);
    PyMem_RawFree(self->prev);
    PyMem_RawFree(self->next);
    if (self->keyed) {
        dt_free(&self->map);
    }
    for (Py_ssize_t block = 0; self->id_objects != NULL && block < self->num_id_slots; block++) {
        Py_XDECREF(self->id_objects[block]);
    }
    PyMem_Free(self->id_objects);
    Py_CLEAR(self->journal);
    Py_CLEAR(self->hashes);
    Py_CLEAR(self->maps);
    Py_CLEAR(self->dups);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->double_free);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(self->journal);
    Py_VISIT(self->hashes);
    Py_VISIT(self->maps);
    Py_VISIT(self->dups);
    Py_VISIT(self->groups);
    Py_VISIT(self->double_free);
    return 0;
}

static int
Core_clear(Core *self)
{
    Py_CLEAR(self->journal);
    Py_CLEAR(self->hashes);
    Py_CLEAR(self->maps);
    Py_CLEAR(self->dups);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->double_free);
    return 0;
}

static int
Core_init(Core *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"num_blocks", "double_free_error", "queue", NULL};
    Py_ssize_t n;
    PyObject *double_free;
    int queue = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO|$p", keywords, &n, &double_free,
                                     &queue)) {
        return -1;
    }
    if (self->ref != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a native pool core is initialised once");
        return -1;
    }
    if (n < 1 || n >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "num_blocks must be in 1..%d, got %zd", INT32_MAX - 1, n);
        return -1;
    }
    self->ref = PyMem_RawCalloc((size_t)n, sizeof(int32_t));
    Py_ssize_t id_slots = n < ID_OBJECTS_MAX ? n : ID_OBJECTS_MAX;
    self->id_objects = PyMem_Calloc((size_t)id_slots, sizeof(PyObject *));
    if (queue) {
        self->prev = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
        self->next = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    }
    if (self->ref == NULL || self->id_objects == NULL ||
        (queue && (self->prev == NULL || self->next == NULL))) {
        PyErr_NoMemory();
        return -1;
    }
    self->n = n;
    self->num_id_slots = id_slots;
    self->stride = sizeof(int32_t);
    /* A fresh queue holds every block in id order, as the Python one. */
    for (Py_ssize_t block = 0; queue && block <= n; block++) {
        self->prev[block] = (int32_t)(block == 0 ? n : block - 1);
        self->next[block] = (int32_t)(block == n ? 0 : block + 1);
    }
    self->num_free = n;
    Py_INCREF(Py_None);
    self->journal = Py_None;
    Py_INCREF(double_free);
    self->double_free = double_free;
    return 0;
}

static PyObject *
Core_bind(Core *self, PyObject *args)
{
    PyObject *hashes, *maps, *dups, *groups;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &hashes, &PyList_Type, &maps,
                          &PyList_Type, &dups, &PyByteArray_Type, &groups)) {
        return NULL;
    }
    if (PyList_GET_SIZE(hashes) != self->n || PyByteArray_GET_SIZE(groups) != self->n) {
        PyErr_SetString(PyExc_ValueError, "bind(): hashes and groups need one entry a block");
        return NULL;
    }
    if (PyList_GET_SIZE(maps) != PyList_GET_SIZE(dups) || PyList_GET_SIZE(maps) < 1 ||
        PyList_GET_SIZE(maps) > 256) {
        PyErr_SetString(PyExc_ValueError, "bind(): 1..256 groups, one map and one dups dict each");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(maps); i++) {
        if (!PyDict_CheckExact(PyList_GET_ITEM(maps, i)) ||
            !PyDict_CheckExact(PyList_GET_ITEM(dups, i))) {
            PyErr_SetString(PyExc_TypeError, "bind(): maps and dups must hold dicts");
            return NULL;
        }
    }
    Py_INCREF(hashes);
    Py_XSETREF(self->hashes, hashes);
    Py_INCREF(maps);
    Py_XSETREF(self->maps, maps);
    Py_INCREF(dups);
    Py_XSETREF(self->dups, dups);
    Py_INCREF(groups);
    Py_XSETREF(self->groups, groups);
    Py_RETURN_NONE;
}

/* A group id stored in the bytearray must name a bound map. */
static int
check_group(Core *self, unsigned char group)
{
    if (group >= PyList_GET_SIZE(self->maps)) {
        PyErr_Format(PyExc_RuntimeError, "block recorded in group %d of %zd", (int)group,
                     PyList_GET_SIZE(self->maps));
        return -1;
    }
    return 0;
}

/* -- the digest form of the prefix map ------------------------------------- */

static inline const unsigned char *
group_bytes(Core *self)
{
    return (const unsigned char *)PyByteArray_AS_STRING(self->groups);
}

/* The digest of ``key`` when it is a bytes object of the map's width (with
 * int keys: an int in the signed 64-bit range, as 8 bytes in self->key, valid
 * until the next call), else NULL (no exception: a key of another kind is
 * cached under no block). */
static inline const unsigned char *
key_digest(Core *self, PyObject *key)
{
    if (self->int_keys) {
        int overflow;
        long long value = PyLong_CheckExact(key) ? PyLong_AsLongLongAndOverflow(key, &overflow) : -1;
        if (!PyLong_CheckExact(key) || overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return NULL;
        }
        for (int i = 0; i < 8; i++) {
            self->key[i] = (unsigned char)((unsigned long long)value >> (8 * i));
        }
        return self->key;
    }
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != (Py_ssize_t)self->map.width) {
        return NULL;
    }
    return (const unsigned char *)PyBytes_AS_STRING(key);
}

/* key_digest, raising TypeError (naming the fix) for a key of another kind. */
static const unsigned char *
required_digest(Core *self, PyObject *key)
{
    const unsigned char *digest = key_digest(self, key);
    if (digest == NULL && self->int_keys) {
        PyErr_Format(PyExc_TypeError,
                     "block hash %R is not an int in the signed 64-bit range: this pool was "
                     "built with int_hashes=True (hash with the algorithm it was built for, or "
                     "build it with int_hashes=False for hashes of any kind)",
                     key);
    }
    else if (digest == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "block hash %R is not a bytes object of %zd bytes: this pool was built "
                     "with digest_size=%zd (hash with the algorithm it was built for, or "
                     "build it with digest_size=None for hashes of any kind)",
                     key, (Py_ssize_t)self->map.width, (Py_ssize_t)self->map.width);
    }
    return digest;
}

/* The hash ``block`` carries, as a new bytes object. */
static inline PyObject *
digest_object(Core *self, int32_t block)
{
    const unsigned char *digest = dt_digest(&self->map, block);
    if (self->int_keys) {
        unsigned long long value = 0;
        for (int i = 7; i >= 0; i--) {
            value = value << 8 | digest[i];
        }
        return PyLong_FromLongLong((long long)value);
    }
    return PyBytes_FromStringAndSize((const char *)digest, (Py_ssize_t)self->map.width);
}

/* A group id of the map, or -1 with IndexError set. */
static Py_ssize_t
map_group(Core *self, PyObject *arg)
{
    Py_ssize_t group = PyLong_AsSsize_t(arg);
    if (group == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (group < 0 || (size_t)group >= self->map.num_groups) {
        PyErr_Format(PyExc_IndexError, "group %zd is not a group of this pool", group);
        return -1;
    }
    return group;
}

/* Whether ``block`` is the table's entry for the digest it stores, in its group. */
static inline int
is_entry(Core *self, int32_t block)
{
    const unsigned char *groups = group_bytes(self);
    return dt_find(&self->map, groups, groups[block], dt_digest(&self->map, block)) == block;
}

/* Before ``block`` stores another digest: drop its entry under the old one. */
static void
leave_entry(Core *self, int32_t block, const unsigned char *digest)
{
    const unsigned char *old = dt_digest(&self->map, block);
    if ((digest == NULL || memcmp(old, digest, self->map.width) != 0) && is_entry(self, block)) {
        dt_remove(&self->map, group_bytes(self), group_bytes(self)[block], old);
    }
}

static PyObject *
Core_bind_digests(Core *self, PyObject *args)
{
    Py_ssize_t width;
    PyObject *dups, *groups;
    int int_keys = 0;
    if (!PyArg_ParseTuple(args, "nO!O!|p", &width, &PyList_Type, &dups, &PyByteArray_Type,
                          &groups, &int_keys)) {
        return NULL;
    }
    if (int_keys && width != 8) {
        PyErr_Format(PyExc_ValueError, "int keys are 8 bytes wide, got %zd", width);
        return NULL;
    }
    if (self->keyed || self->hashes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_digests(): the core is already bound");
        return NULL;
    }
    if (width < 1 || width > 64) {
        PyErr_Format(PyExc_ValueError, "digest_size must be in 1..64 bytes, got %zd", width);
        return NULL;
    }
    Py_ssize_t num_groups = PyList_GET_SIZE(dups);
    if (num_groups < 1 || num_groups > 256 || PyByteArray_GET_SIZE(groups) != self->n) {
        PyErr_SetString(PyExc_ValueError,
                        "bind_digests(): 1..256 groups, and one group byte a block");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < num_groups; i++) {
        if (!PyDict_CheckExact(PyList_GET_ITEM(dups, i))) {
            PyErr_SetString(PyExc_TypeError, "bind_digests(): dups must hold dicts");
            return NULL;
        }
    }
    if (dt_init(&self->map, (size_t)self->n, (size_t)width, (size_t)num_groups,
                PyMem_RawCalloc, PyMem_RawFree) < 0) {
        return PyErr_NoMemory();
    }
    self->keyed = 1;
    self->int_keys = int_keys;
    Py_INCREF(dups);
    Py_XSETREF(self->dups, dups);
    Py_INCREF(groups);
    Py_XSETREF(self->groups, groups);
    Py_RETURN_NONE;
}

static int
check_keyed(Core *self)
{
    if (!self->keyed) {
        PyErr_SetString(PyExc_RuntimeError, "this core keeps no digest map (bind_digests)");
        return -1;
    }
    return 0;
}

/* Evict one just-taken block: drop its entry, or leave the rare cases to ``uncache``.
 * An evicted block is counted in ``num_evicted`` and, unless ``digests`` is
 * NULL, appended to ``evicted`` (block ids) and its digest to ``digests``. */
static int
evict_digest(Core *self, int32_t block, PyObject *uncache, PyObject *removed,
             int32_t *evicted, Py_ssize_t *num_evicted, unsigned char *digests)
{
    if (!dt_carries(&self->map, block)) {
        return 0;
    }
    const unsigned char *groups = group_bytes(self);
    unsigned group = groups[block];
    const unsigned char *digest = dt_digest(&self->map, block);
    PyObject *dups = PyList_GET_ITEM(self->dups, group);
    int rare = 0;
    if (PyDict_GET_SIZE(dups)) {
        PyObject *key = digest_object(self, block);
        rare = key == NULL ? -1 : PyDict_Contains(dups, key);
        Py_XDECREF(key);
    }
    if (rare < 0) {
        return -1;
    }
    if (rare || !dt_remove_block(&self->map, groups, block)) {
        /* Copies wait under this hash: the Python step hands it on and journals itself. */
        PyObject *result = PyObject_CallFunction(uncache, "i", block);
        Py_XDECREF(result);
        return result == NULL ? -1 : 0;
    }
    if (digests != NULL) {
        dt_copy(&self->map, digests + (size_t)*num_evicted * self->map.width, digest);
        evicted[*num_evicted] = block;
    }
    (*num_evicted)++;
    dt_drop(&self->map, block);
    if (removed != Py_None) {
        PyObject *result = PyObject_CallFunction(removed, "Ni", digest_object(self, block),
                                                 (int)group);
        Py_XDECREF(result);
        return result == NULL ? -1 : 0;
    }
    return 0;
}

/* How many blocks ahead the loops over the digest map start loading what a
 * block's step reads (a second stage, half as far ahead, what that leads to):
 * in a large pool every block's digest and slot is a cache miss, and loading
 * several at once overlaps them. */
#define LOAD_AHEAD 8

/* The block id at ``index`` of a list the pool made (its items are ints in range). */
static inline int32_t
list_block(PyObject *blocks, Py_ssize_t index)
{
    return (int32_t)int_value(PyList_GET_ITEM(blocks, index));
}

/* A bytes object of ``size`` bytes to fill (size 0: one byte, shrunk later). */
static PyObject *
bytes_to_fill(Py_ssize_t size)
{
    return PyBytes_FromStringAndSize(NULL, size ? size : 1);
}

/* Journal the undo of an eviction: ``ids`` and ``digests`` (bytes objects,
 * stolen) hold ``count`` entries each, and are cut to that size. Any pending
 * exception is kept. */
static int
journal_evicted(Core *self, PyObject *ids, PyObject *digests, Py_ssize_t count)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *args = NULL;
    if (_PyBytes_Resize(&ids, count * (Py_ssize_t)sizeof(int32_t)) == 0 &&
        _PyBytes_Resize(&digests, count * (Py_ssize_t)self->map.width) == 0) {
        args = PyTuple_Pack(2, ids, digests);
    }
    Py_XDECREF(ids);
    Py_XDECREF(digests);
    int failed = journal_append(self, "_undo_evict_digests", args) < 0;
    if (type != NULL) {
        PyErr_Restore(type, value, traceback);
    }
    return failed ? -1 : 0;
}

/* Evict the just-taken ``blocks``; inside a transaction, journal the entries
 * dropped (ids and digests, written straight into the undo step's bytes). */
static int
evict_taken_digests(Core *self, PyObject *blocks, PyObject *uncache, PyObject *removed)
{
    Py_ssize_t count = PyList_GET_SIZE(blocks), num_evicted = 0;
    Py_ssize_t width = (Py_ssize_t)self->map.width;
    PyObject *ids = NULL, *digests = NULL;
    if (journaling(self)) {
        ids = bytes_to_fill(count * (Py_ssize_t)sizeof(int32_t));
        digests = ids == NULL ? NULL : bytes_to_fill(count * width);
        if (digests == NULL) {
            Py_XDECREF(ids);
            return -1;
        }
    }
    int32_t *evicted = ids == NULL ? NULL : (int32_t *)PyBytes_AS_STRING(ids);
    unsigned char *copies = digests == NULL ? NULL : (unsigned char *)PyBytes_AS_STRING(digests);
    const unsigned char *groups = group_bytes(self);
    int failed = 0;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        if (self->map.prefetch) {
            /* Each block's digest and home slot lie anywhere: start loading
             * them a few blocks ahead, so that the misses overlap. */
            if (i + LOAD_AHEAD < count) {
                dt_prefetch_digest(&self->map, list_block(blocks, i + LOAD_AHEAD));
            }
            if (i + LOAD_AHEAD / 2 < count) {
                int32_t soon = list_block(blocks, i + LOAD_AHEAD / 2);
                if (dt_carries(&self->map, soon)) {
                    dt_prefetch_home(&self->map, groups, soon);
                }
            }
        }
        int32_t block = list_block(blocks, i);
        failed = evict_digest(self, block, uncache, removed, evicted, &num_evicted, copies) < 0;
    }
    if (ids != NULL && num_evicted) {
        /* Journaled even after a failure, so that the rollback restores the entries. */
        failed |= journal_evicted(self, ids, digests, num_evicted) < 0;
    }
    else {
        Py_XDECREF(ids);
        Py_XDECREF(digests);
    }
    return failed ? -1 : 0;
}

static PyObject *
Core_undo_evict_digests(Core *self, PyObject *args)
{
    const char *blocks, *digests;
    Py_ssize_t blocks_size, digests_size;
    if (!PyArg_ParseTuple(args, "y#y#", &blocks, &blocks_size, &digests, &digests_size) ||
        check_keyed(self) < 0) {
        return NULL;
    }
    Py_ssize_t count = blocks_size / (Py_ssize_t)sizeof(int32_t);
    if (digests_size != count * (Py_ssize_t)self->map.width) {
        PyErr_SetString(PyExc_ValueError, "_undo_evict_digests: one digest a block");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block;
        memcpy(&block, blocks + i * (Py_ssize_t)sizeof(int32_t), sizeof block);
        dt_carry(&self->map, block, (const unsigned char *)digests + i * self->map.width);
        dt_insert(&self->map, group_bytes(self), block);
    }
    Py_RETURN_NONE;
}

/* Cache each non-null block under its hash (every hash checked first: a bad
 * one changes nothing); a hash already cached in the group keeps its block,
 * the new one joins the duplicates. */
static int
enter_digests(Core *self, PyObject **items, PyObject **keys, Py_ssize_t size, Py_ssize_t group,
              int several_groups, Py_ssize_t *entered)
{
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t block = block_of(self, items[i]);
        if (block < 0 || (block && required_digest(self, keys[i]) == NULL)) {
            return -1;
        }
        if (block && dt_carries(&self->map, block)) {
            PyErr_Format(PyExc_RuntimeError, "enter(): block %d is already cached", block);
            return -1;
        }
    }
    unsigned char *groups = (unsigned char *)PyByteArray_AS_STRING(self->groups);
    PyObject *dups = PyList_GET_ITEM(self->dups, group);
    for (Py_ssize_t i = 0; i < size; i++) {
        if (self->map.prefetch && i + LOAD_AHEAD < size) {
            /* The block's digest and its key's slot lie anywhere: load ahead. */
            int32_t soon = (int32_t)int_value(items[i + LOAD_AHEAD]);
            const unsigned char *key = soon ? key_digest(self, keys[i + LOAD_AHEAD]) : NULL;
            if (key != NULL) {
                dt_prefetch_digest(&self->map, soon);
                dt_prefetch_key(&self->map, (unsigned)group, key);
            }
        }
        int32_t block = (int32_t)int_value(items[i]);
        if (!block) {
            continue;
        }
        /* The block carries no hash (checked above), so it is no entry either. */
        const unsigned char *digest = key_digest(self, keys[i]);
        if (several_groups) {
            groups[block] = (unsigned char)group;
        }
        dt_carry(&self->map, block, digest);
        (*entered)++;
        if (dt_find_or_insert(&self->map, groups, block) < 0) {
            continue;
        }
        PyObject *empty = PyList_New(0);
        PyObject *waiting = empty == NULL ? NULL : PyDict_SetDefault(dups, keys[i], empty);
        Py_XDECREF(empty);
        if (waiting == NULL || PyList_Append(waiting, items[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ``hint`` for hashes[at] in every group of ``groups`` (nothing past ``stop``). */
static inline void
prefetch_match(Core *self, PyObject **hashes, Py_ssize_t at, Py_ssize_t stop,
               const Py_ssize_t *groups, Py_ssize_t width,
               void (*hint)(const DigestTable *, unsigned, const unsigned char *))
{
    if (at >= stop) {
        return;
    }
    const unsigned char *key = key_digest(self, hashes[at]);
    for (Py_ssize_t g = 0; key != NULL && g < width; g++) {
        hint(&self->map, (unsigned)groups[g], key);
    }
}

/* A new reference to the int of ``block`` (a block id of this core): the
 * one the core keeps for it, made on first use, below ID_OBJECTS_MAX. */
static PyObject *
block_object(Core *self, int32_t block)
{
    if (block >= self->num_id_slots) {
        return PyLong_FromLong(block);
    }
    PyObject *object = self->id_objects[block];
    if (object == NULL) {
        object = PyLong_FromLong(block);
        if (object == NULL) {
            return NULL;
        }
        self->id_objects[block] = object; /* the core's own reference */
        self->num_id_objects++;
    }
    Py_INCREF(object);
    return object;
}

/* A list of the ``count`` block ids at ``ids``, ``stride`` apart. */
static PyObject *
id_list(Core *self, const int32_t *ids, Py_ssize_t count, Py_ssize_t stride)
{
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        PyObject *block = block_object(self, ids[i * stride]);
        if (block == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, block);
    }
    return list;
}

/* How many of hashes[start:stop] (from start on) are found in every group of
 * ``groups``; their blocks go to ``found``, ``width`` a hash. */
static Py_ssize_t
run_of_digests(Core *self, PyObject **hashes, Py_ssize_t start, Py_ssize_t stop,
               const Py_ssize_t *groups, Py_ssize_t width, int32_t *found)
{
    const unsigned char *group_of_block = group_bytes(self);
    for (Py_ssize_t i = start; i < stop; i++) {
        if (self->map.prefetch) {
            /* Load ahead: the slots of a later key, then the digest they name. */
            prefetch_match(self, hashes, i + LOAD_AHEAD, stop, groups, width, dt_prefetch_key);
            prefetch_match(self, hashes, i + LOAD_AHEAD / 2, stop, groups, width,
                           dt_prefetch_entry);
        }
        const unsigned char *digest = key_digest(self, hashes[i]);
        if (digest == NULL) {
            return i - start;
        }
        int32_t *row = found + (i - start) * width;
        for (Py_ssize_t g = 0; g < width; g++) {
            row[g] = dt_find(&self->map, group_of_block, (unsigned)groups[g], digest);
            if (row[g] < 0) {
                return i - start;
            }
        }
    }
    return stop - start;
}

/* The run of hashes[start:stop] found in every group of ``groups``, one list a group. */
static PyObject *
match_digests(Core *self, PyObject **hashes, Py_ssize_t start, Py_ssize_t stop,
              const Py_ssize_t *groups, Py_ssize_t width)
{
    size_t cells = (size_t)(stop - start) * (size_t)width;
    int32_t *found = PyMem_Malloc((cells ? cells : 1) * sizeof(int32_t));
    if (found == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t run = run_of_digests(self, hashes, start, stop, groups, width, found);
    PyObject *out = PyTuple_New(width);
    for (Py_ssize_t g = 0; out != NULL && g < width; g++) {
        PyObject *hits = id_list(self, found + g, run, width);
        if (hits == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, g, hits);
    }
    PyMem_Free(found);
    return out;
}

/* -- the digest map, item by item (the specification's rare steps) ---------- */

static PyObject *
Core_hash_at(Core *self, PyObject *arg)
{
    int32_t block = check_keyed(self) < 0 ? -1 : block_of(self, arg);
    if (block < 0) {
        return NULL;
    }
    if (!dt_carries(&self->map, block)) {
        Py_RETURN_NONE;
    }
    return digest_object(self, block);
}

static PyObject *
Core_set_hash(Core *self, PyObject *args)
{
    PyObject *item, *key;
    if (!PyArg_ParseTuple(args, "OO", &item, &key) || check_keyed(self) < 0) {
        return NULL;
    }
    int32_t block = block_of(self, item);
    const unsigned char *digest = key == Py_None || block < 0 ? NULL : required_digest(self, key);
    if (block < 0 || (key != Py_None && digest == NULL)) {
        return NULL;
    }
    leave_entry(self, block, digest);
    if (digest == NULL) {
        dt_drop(&self->map, block);
    }
    else {
        dt_carry(&self->map, block, digest);
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_map_get(Core *self, PyObject *args)
{
    PyObject *group_arg, *key;
    if (!PyArg_ParseTuple(args, "OO", &group_arg, &key) || check_keyed(self) < 0) {
        return NULL;
    }
    Py_ssize_t group = map_group(self, group_arg);
    if (group < 0) {
        return NULL;
    }
    const unsigned char *digest = key_digest(self, key);
    int32_t block = digest == NULL ? -1
                                   : dt_find(&self->map, group_bytes(self), (unsigned)group, digest);
    if (block < 0) {
        Py_RETURN_NONE;
    }
    return block_object(self, block);
}

/* map[group][key] = block: the block takes the key's digest (it must carry no
 * other hash) and becomes the entry, replacing the one there. Unlike a dict
 * beside a hash list, the block then carries the hash: an entry always does. */
static PyObject *
Core_map_set(Core *self, PyObject *args)
{
    PyObject *group_arg, *key, *item;
    if (!PyArg_ParseTuple(args, "OOO", &group_arg, &key, &item) || check_keyed(self) < 0) {
        return NULL;
    }
    Py_ssize_t group = map_group(self, group_arg);
    int32_t block = group < 0 ? -1 : block_of(self, item);
    const unsigned char *digest = block < 0 ? NULL : required_digest(self, key);
    if (digest == NULL) {
        return NULL;
    }
    const unsigned char *groups = group_bytes(self);
    if (groups[block] != group) {
        PyErr_Format(PyExc_ValueError, "block %d is recorded in group %d, not %zd", block,
                     (int)groups[block], group);
        return NULL;
    }
    if (dt_carries(&self->map, block) &&
        memcmp(dt_digest(&self->map, block), digest, self->map.width) != 0) {
        PyErr_Format(PyExc_ValueError, "block %d carries another hash than %R", block, key);
        return NULL;
    }
    leave_entry(self, block, digest);
    dt_carry(&self->map, block, digest);
    if (dt_repoint(&self->map, groups, (unsigned)group, digest, block) < 0) {
        dt_insert(&self->map, groups, block);
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_map_del(Core *self, PyObject *args)
{
    PyObject *group_arg, *key;
    if (!PyArg_ParseTuple(args, "OO", &group_arg, &key) || check_keyed(self) < 0) {
        return NULL;
    }
    Py_ssize_t group = map_group(self, group_arg);
    if (group < 0) {
        return NULL;
    }
    const unsigned char *digest = key_digest(self, key);
    if (digest == NULL ||
        dt_remove(&self->map, group_bytes(self), (unsigned)group, digest) < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_map_len(Core *self, PyObject *arg)
{
    Py_ssize_t group = check_keyed(self) < 0 ? -1 : map_group(self, arg);
    if (group < 0) {
        return NULL;
    }
    return PyLong_FromSize_t(self->map.entries[group]);
}

/* The (hash, block) entries of one group, in table order. */
static PyObject *
Core_map_items(Core *self, PyObject *arg)
{
    Py_ssize_t group = check_keyed(self) < 0 ? -1 : map_group(self, arg);
    PyObject *out = group < 0 ? NULL : PyList_New(0);
    const unsigned char *groups = out == NULL ? NULL : group_bytes(self);
    for (size_t index = 0; out != NULL && index < self->map.cap; index++) {
        int32_t block = dt_slot_block(&self->map, index);
        if (block < 0 || groups[block] != group) {
            continue;
        }
        PyObject *entry = Py_BuildValue("(Ni)", digest_object(self, block), block);
        if (entry == NULL || PyList_Append(out, entry) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(entry);
    }
    return out;
}

static PyObject *
Core_clear_map(Core *self, PyObject *unused)
{
    if (check_keyed(self) < 0) {
        return NULL;
    }
    dt_clear(&self->map);
    Py_RETURN_NONE;
}

/* -- the free-queue interface (kvcore._eviction.queue.FreeQueue) ------------ */

/* Pop ``count`` blocks from the head into a new list (count <= queued blocks). */
static PyObject *
pop_head(Core *self, Py_ssize_t count)
{
    int32_t sentinel = q_sentinel(self);
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block = self->next[sentinel];
        PyObject *item = block == sentinel ? NULL : block_object(self, block);
        if (item == NULL) {
            /* Give back what was popped (the caller promised enough blocks). */
            for (Py_ssize_t j = i - 1; j >= 0; j--) {
                int32_t back = (int32_t)PyLong_AsLong(PyList_GET_ITEM(out, j));
                q_link_before(self, back, self->next[sentinel]);
            }
            Py_DECREF(out);
            if (block == sentinel) {
                PyErr_SetString(PyExc_RuntimeError, "the free queue ran out of blocks");
            }
            return NULL;
        }
        q_unlink(self, block);
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* Put ``blocks`` (taken from the head, in order) back at the head. */
static int
push_head(Core *self, PyObject *blocks)
{
    int32_t sentinel = q_sentinel(self);
    for (Py_ssize_t i = PyList_GET_SIZE(blocks) - 1; i >= 0; i--) {
        int32_t block = block_of(self, PyList_GET_ITEM(blocks, i));
        if (block < 0) {
            return -1;
        }
        q_link_before(self, block, self->next[sentinel]);
    }
    return 0;
}

static PyObject *
Core_take(Core *self, PyObject *arg)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(arg);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "take(n) needs n >= 0");
        return NULL;
    }
    PyObject *out = pop_head(self, count);
    if (out == NULL) {
        return NULL;
    }
    if (journaling(self) && journal_append(self, "_undo_take", PyTuple_Pack(1, out)) < 0) {
        push_head(self, out);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
Core_undo_take(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    if (!PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "_undo_take expects a list");
        return NULL;
    }
    if (push_head(self, blocks) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Unlink the last ``count`` blocks of the queue (undo of appends). */
static void
drop_tail(Core *self, Py_ssize_t count)
{
    int32_t sentinel = q_sentinel(self);
    for (Py_ssize_t i = 0; i < count && self->prev[sentinel] != sentinel; i++) {
        q_unlink(self, self->prev[sentinel]);
    }
}

/* Append every block of ``fast`` at the tail; -1 (nothing changed) on a bad id or a queued one. */
static int
append_tail(Core *self, PyObject *fast)
{
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int32_t sentinel = q_sentinel(self);
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t block = block_of(self, items[i]);
        if (block >= 0 && self->prev[block] != -1) {
            PyErr_Format(PyExc_ValueError, "block %d is already in the free queue", block);
            block = -1;
        }
        if (block < 0) {
            drop_tail(self, i);
            return -1;
        }
        q_link_before(self, block, sentinel);
    }
    return 0;
}

static PyObject *
Core_release(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(blocks, "release() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    int failed = append_tail(self, fast);
    Py_DECREF(fast);
    if (failed) {
        return NULL;
    }
    if (journaling(self) &&
        journal_append(self, "_undo_release", Py_BuildValue("(n)", size)) < 0) {
        drop_tail(self, size);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_undo_release(Core *self, PyObject *arg)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(arg);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    drop_tail(self, count);
    Py_RETURN_NONE;
}

/* Relink blocks unlinked in the order of ``links`` (block, prev, next triplets), newest first. */
static void
relink(Core *self, const int32_t *links, Py_ssize_t count)
{
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        int32_t block = links[3 * i], before = links[3 * i + 1], after = links[3 * i + 2];
        self->prev[block] = before;
        self->next[block] = after;
        self->next[before] = block;
        self->prev[after] = block;
    }
}

static PyObject *
Core_undo_unlink(Core *self, PyObject *links)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    if (!PyBytes_Check(links) || PyBytes_GET_SIZE(links) % (3 * sizeof(int32_t))) {
        PyErr_SetString(PyExc_TypeError, "_undo_unlink expects the bytes of block triplets");
        return NULL;
    }
    relink(self, (const int32_t *)PyBytes_AS_STRING(links),
           PyBytes_GET_SIZE(links) / (Py_ssize_t)(3 * sizeof(int32_t)));
    Py_RETURN_NONE;
}

/* Unlink ``block`` (queued), recording its neighbours at ``links``. */
static inline void
unlink_recorded(Core *self, int32_t block, int32_t *links)
{
    links[0] = block;
    links[1] = self->prev[block];
    links[2] = self->next[block];
    q_unlink(self, block);
}

/* Journal the undo of ``count`` recorded unlinks (or relink them when that fails). */
static int
journal_unlinks(Core *self, const char *name, PyObject *first, int32_t *links, Py_ssize_t count)
{
    PyObject *record = PyBytes_FromStringAndSize((const char *)links,
                                                 count * (Py_ssize_t)(3 * sizeof(int32_t)));
    PyObject *args = record == NULL ? NULL
                     : first == NULL ? PyTuple_Pack(1, record)
                                     : PyTuple_Pack(2, first, record);
    Py_XDECREF(record);
    if (journal_append(self, name, args) < 0) {
        relink(self, links, count);
        return -1;
    }
    return 0;
}

static PyObject *
Core_revive(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(blocks, "revive() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int32_t *links = PyMem_Malloc((size_t)(size ? size : 1) * 3 * sizeof(int32_t));
    if (links == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    Py_ssize_t done = 0;
    for (; done < size; done++) {
        int32_t block = block_of(self, items[done]);
        if (block >= 0 && self->prev[block] == -1) {
            PyErr_Format(PyExc_ValueError, "block %d is not in the free queue", block);
            block = -1;
        }
        if (block < 0) {
            break;
        }
        unlink_recorded(self, block, links + 3 * done);
    }
    Py_DECREF(fast);
    int failed = done < size;
    if (failed) {
        relink(self, links, done);
    }
    else if (journaling(self)) {
        failed = journal_unlinks(self, "_undo_unlink", NULL, links, done) < 0;
    }
    PyMem_Free(links);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_ignore(Core *self, PyObject *args)
{
    Py_RETURN_NONE;
}

static PyObject *
Core_queued(Core *self, PyObject *unused)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    int32_t sentinel = q_sentinel(self);
    Py_ssize_t steps = 0;
    for (int32_t block = self->next[sentinel]; block != sentinel; block = self->next[block]) {
        /* A cycle would never end: more steps than blocks is corruption. */
        if (++steps > self->n) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_RuntimeError, "the native free queue has a cycle");
            return NULL;
        }
        PyObject *item = block_object(self, block);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *
Core_iter(Core *self)
{
    PyObject *blocks = Core_queued(self, NULL);
    if (blocks == NULL) {
        return NULL;
    }
    PyObject *iterator = PyObject_GetIter(blocks);
    Py_DECREF(blocks);
    return iterator;
}

static PyObject *
Core_is_queued(Core *self, PyObject *arg)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    int32_t block = block_of(self, arg);
    if (block < 0) {
        return NULL;
    }
    return PyBool_FromLong(self->prev[block] != -1);
}

/* -- the pool's batched operations ----------------------------------------- */

/* Drop ``block``'s hash from its map: the block was the map's entry and had no copies. */
static int
evict_entry(Core *self, int32_t block, PyObject *hash, PyObject *map, PyObject *removed,
            unsigned char group, PyObject *evicted, PyObject *evicted_hashes)
{
    if (PyDict_DelItem(map, hash) < 0) {
        return -1;
    }
    PyObject *item = block_object(self, block);
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(evicted, item) < 0 || PyList_Append(evicted_hashes, hash) < 0;
    Py_DECREF(item);
    /* The slot's reference moves to evicted_hashes (appended above). */
    Py_INCREF(Py_None);
    PyList_SetItem(self->hashes, block, Py_None);
    if (failed) {
        return -1;
    }
    if (removed != Py_None) {
        PyObject *result = PyObject_CallFunction(removed, "Oi", hash, (int)group);
        if (result == NULL) {
            return -1;
        }
        Py_DECREF(result);
    }
    return 0;
}

/* Evict one just-taken block: drop its hash, handing it to its oldest copy if any. */
static int
evict_one(Core *self, int32_t block, PyObject *uncache, PyObject *removed, PyObject *evicted,
          PyObject *evicted_hashes)
{
    PyObject *hash = PyList_GET_ITEM(self->hashes, block);
    if (hash == Py_None) {
        return 0;
    }
    unsigned char group = group_of(self, block);
    if (check_group(self, group) < 0) {
        return -1;
    }
    PyObject *map = PyList_GET_ITEM(self->maps, group);
    PyObject *dups = PyList_GET_ITEM(self->dups, group);
    int has_copies = PyDict_GET_SIZE(dups) ? PyDict_Contains(dups, hash) : 0;
    if (has_copies < 0) {
        return -1;
    }
    Py_ssize_t entry = has_copies ? -1 : dict_block(map, hash);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (has_copies || entry != block) {
        /* Rare: copies wait under this hash; the Python step journals itself. */
        PyObject *result = PyObject_CallFunction(uncache, "i", block);
        Py_XDECREF(result);
        return result == NULL ? -1 : 0;
    }
    Py_INCREF(hash);
    int failed = evict_entry(self, block, hash, map, removed, group, evicted, evicted_hashes);
    Py_DECREF(hash);
    return failed;
}

static int
evict_taken(Core *self, PyObject *blocks, PyObject *uncache, PyObject *removed)
{
    PyObject *evicted = PyList_New(0);
    PyObject *evicted_hashes = PyList_New(0);
    if (evicted == NULL || evicted_hashes == NULL) {
        Py_XDECREF(evicted);
        Py_XDECREF(evicted_hashes);
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks) && !failed; i++) {
        int32_t block = list_block(blocks, i);
        failed = evict_one(self, block, uncache, removed, evicted, evicted_hashes) < 0;
    }
    /* Journaled even after a failure, so that the rollback restores the hashes. */
    if (PyList_GET_SIZE(evicted) && journaling(self)) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (journal_append(self, "_undo_evict", PyTuple_Pack(2, evicted, evicted_hashes)) < 0) {
            failed = 1;
        }
        if (type != NULL) {
            PyErr_Restore(type, value, traceback);
        }
    }
    Py_DECREF(evicted);
    Py_DECREF(evicted_hashes);
    return failed ? -1 : 0;
}

static PyObject *
Core_take_blocks(Core *self, PyObject *args)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    Py_ssize_t count;
    int evict;
    PyObject *uncache, *removed;
    if (!PyArg_ParseTuple(args, "npOO", &count, &evict, &uncache, &removed)) {
        return NULL;
    }
    if (check_bound(self) < 0) {
        return NULL;
    }
    if (count < 0 || count > self->num_free) {
        PyErr_Format(PyExc_ValueError, "cannot take %zd blocks: only %zd are free", count,
                     self->num_free);
        return NULL;
    }
    PyObject *blocks = pop_head(self, count);
    if (blocks == NULL) {
        return NULL;
    }
    if (journaling(self) &&
        journal_append(self, "_undo_take_blocks", PyTuple_Pack(1, blocks)) < 0) {
        push_head(self, blocks);
        Py_DECREF(blocks);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        self->ref[list_block(blocks, i)] = 1;
    }
    self->num_free -= count;
    if (evict && (self->keyed ? evict_taken_digests(self, blocks, uncache, removed)
                              : evict_taken(self, blocks, uncache, removed)) < 0) {
        Py_DECREF(blocks);
        return NULL;
    }
    return blocks;
}

static PyObject *
Core_undo_take_blocks(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    if (!PyList_Check(blocks) || push_head(self, blocks) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_undo_take_blocks expects a list");
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        self->ref[list_block(blocks, i)] = 0;
    }
    self->num_free += PyList_GET_SIZE(blocks);
    Py_RETURN_NONE;
}

static PyObject *
Core_undo_evict(Core *self, PyObject *args)
{
    PyObject *blocks, *hashes;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &blocks, &PyList_Type, &hashes) ||
        check_bound(self) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        PyObject *item = PyList_GET_ITEM(blocks, i), *hash = PyList_GET_ITEM(hashes, i);
        int32_t block = block_of(self, item);
        if (block < 0 || check_group(self, group_of(self, block)) < 0) {
            return NULL;
        }
        PyObject *map = PyList_GET_ITEM(self->maps, group_of(self, block));
        if (PyDict_SetItem(map, hash, item) < 0) {
            return NULL;
        }
        Py_INCREF(hash);
        PyList_SetItem(self->hashes, block, hash);
    }
    Py_RETURN_NONE;
}

/* Add ``delta`` to the count of each non-null block of items[0:count] (the
 * undo of a partial release, +1, or of a partial hit, -1); ids outside the
 * pool are skipped. */
static void
shift_counts(Core *self, PyObject **items, Py_ssize_t count, int32_t delta)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        long block = (long)int_value(items[i]);
        if (block > 0 && block < self->n) {
            self->ref[block] += delta;
        }
    }
}

/* Undo a partial release: one count back on each non-null block of items[0:walked]. */
static inline void
unrelease(Core *self, PyObject **items, Py_ssize_t walked)
{
    shift_counts(self, items, walked, 1);
}

/* A new list of items[positions[0]], items[positions[1]], ... (``count`` of them). */
static PyObject *
items_at(PyObject **items, const Py_ssize_t *positions, Py_ssize_t count)
{
    PyObject *list = PyList_New(count);
    for (Py_ssize_t k = 0; list != NULL && k < count; k++) {
        PyObject *item = items[positions[k]];
        Py_INCREF(item);
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

/* What a release collects: the position in the released sequence and the
 * id of each block whose count reached 0, in order. */
typedef struct {
    Py_ssize_t *positions;
    int32_t *ids;
    Py_ssize_t count;
} Freed;

static int
freed_init(Freed *freed, Py_ssize_t size)
{
    size_t room = (size_t)(size ? size : 1);
    freed->positions = PyMem_Malloc(room * sizeof(Py_ssize_t));
    freed->ids = PyMem_Malloc(room * sizeof(int32_t));
    freed->count = 0;
    if (freed->positions == NULL || freed->ids == NULL) {
        PyMem_Free(freed->positions);
        PyMem_Free(freed->ids);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
freed_clear(Freed *freed)
{
    PyMem_Free(freed->positions);
    PyMem_Free(freed->ids);
}

/* Drop a count on each block of ``fast``; note those reaching 0 in ``freed``. */
static int
drop_counts(Core *self, PyObject *fast, Freed *freed)
{
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t block = block_of(self, items[i]);
        if (block < 0) {
            unrelease(self, items, i);
            return -1;
        }
        if (block == 0) {
            continue;
        }
        int32_t count = self->ref[block] - 1;
        self->ref[block] = count;
        if (count < 0) {
            unrelease(self, items, i + 1);
            PyErr_Format(self->double_free,
                         "block %d was freed more often than it was allocated "
                         "(its reference count is already 0)",
                         block);
            return -1;
        }
        if (count == 0) {
            freed->positions[freed->count] = i;
            freed->ids[freed->count++] = block;
        }
    }
    return 0;
}

/* Drop a count on each block of ``fast`` (``freed`` made ready for it):
 * the list of those whose count reached 0, in order, or NULL with an
 * exception and every count as it was. */
static PyObject *
release_counts(Core *self, PyObject *fast, Freed *freed)
{
    if (drop_counts(self, fast, freed) < 0) {
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    if (PyList_CheckExact(fast) && freed->count == PySequence_Fast_GET_SIZE(fast)) {
        /* Every block was freed (the usual release): the caller's own list,
         * as the Python pool returns it, instead of a copy of it. */
        Py_INCREF(fast);
        return fast;
    }
    PyObject *released = items_at(items, freed->positions, freed->count);
    if (released == NULL) {
        unrelease(self, items, PySequence_Fast_GET_SIZE(fast));
    }
    return released;
}

/* Link the ``count`` blocks ``ids`` (their counts just reached 0) at the
 * tail; -1 (nothing linked) if one is queued already. */
static int
link_at_tail(Core *self, const int32_t *ids, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (self->prev[ids[i]] != -1) {
            PyErr_Format(PyExc_ValueError, "block %d is already in the free queue", ids[i]);
            return -1;
        }
    }
    int32_t sentinel = q_sentinel(self);
    for (Py_ssize_t i = 0; i < count; i++) {
        q_link_before(self, ids[i], sentinel);
    }
    return 0;
}

/* Drop a count on each of ``blocks`` and queue those reaching 0 at the
 * tail, in order: how many, or NULL with an exception and nothing changed.
 * Nobody reads the freed blocks, so no list of them is made. */
static PyObject *
Core_release_blocks(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(blocks, "release_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Freed freed;
    if (freed_init(&freed, size) < 0) {
        Py_DECREF(fast);
        return NULL;
    }
    PyObject *result = NULL;
    if (drop_counts(self, fast, &freed) < 0) {
        /* nothing changed */
    }
    else if ((result = PyLong_FromSsize_t(freed.count)) == NULL) {
        unrelease(self, items, size);
    }
    else if (link_at_tail(self, freed.ids, freed.count) < 0) {
        unrelease(self, items, size);
        Py_CLEAR(result);
    }
    else if (journaling(self) &&
             journal_append(self, "_undo_release_blocks",
                            Py_BuildValue("(On)", fast, freed.count)) < 0) {
        drop_tail(self, freed.count);
        unrelease(self, items, size);
        Py_CLEAR(result);
    }
    else {
        self->num_free += freed.count;
    }
    freed_clear(&freed);
    Py_DECREF(fast);
    return result;
}

static PyObject *
Core_undo_release_blocks(Core *self, PyObject *args)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "On", &fast, &count)) {
        return NULL;
    }
    if (!PyList_Check(fast) && !PyTuple_Check(fast)) {
        PyErr_SetString(PyExc_TypeError, "_undo_release_blocks expects a list or tuple");
        return NULL;
    }
    drop_tail(self, count);
    unrelease(self, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast));
    self->num_free -= count;
    Py_RETURN_NONE;
}

/* Take a count on each non-null block of items; note the positions of those
 * that were free in ``positions`` (room for every item) and, with ``links``
 * (a core keeping the queue), unlink them, recording their neighbours there.
 * How many were free, or -1 with an exception and nothing changed. */
static Py_ssize_t
take_counts(Core *self, PyObject **items, Py_ssize_t size, int32_t *links,
            Py_ssize_t *positions)
{
    Py_ssize_t freed = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t block = block_of(self, items[i]);
        int bad = block < 0;
        if (!bad && block && self->ref[block] == 0) {
            if (links != NULL && self->prev[block] == -1) {
                PyErr_Format(PyExc_RuntimeError, "free block %d is not queued", block);
                bad = 1;
            }
            else {
                if (links != NULL) {
                    unlink_recorded(self, block, links + 3 * freed);
                }
                positions[freed++] = i;
            }
        }
        if (bad) {
            shift_counts(self, items, i, -1);
            if (links != NULL) {
                relink(self, links, freed);
            }
            return -1;
        }
        if (block) {
            self->ref[block] += 1;
        }
    }
    return freed;
}

static PyObject *
Core_touch_blocks(Core *self, PyObject *blocks)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(blocks, "touch_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int32_t *links = PyMem_Malloc((size_t)(size ? size : 1) * 3 * sizeof(int32_t));
    Py_ssize_t *positions = PyMem_Malloc((size_t)(size ? size : 1) * sizeof(Py_ssize_t));
    Py_ssize_t unlinked = -1;
    if (links == NULL || positions == NULL) {
        PyErr_NoMemory();
    }
    else {
        unlinked = take_counts(self, items, size, links, positions);
    }
    PyObject *revived = unlinked < 0 ? NULL : items_at(items, positions, unlinked);
    if (unlinked >= 0 && revived == NULL) {
        relink(self, links, unlinked);
        shift_counts(self, items, size, -1);
        unlinked = -1;
    }
    else if (unlinked >= 0 && journaling(self) &&
             journal_unlinks(self, "_undo_touch_blocks", fast, links, unlinked) < 0) {
        shift_counts(self, items, size, -1); /* (journal_unlinks relinked them) */
        unlinked = -1;
    }
    PyMem_Free(links);
    PyMem_Free(positions);
    Py_DECREF(fast);
    if (unlinked < 0) {
        Py_XDECREF(revived);
        return NULL;
    }
    self->num_free -= unlinked;
    return revived;
}

static PyObject *
Core_undo_touch_blocks(Core *self, PyObject *args)
{
    if (check_queue(self) < 0) {
        return NULL;
    }
    PyObject *fast, *links;
    if (!PyArg_ParseTuple(args, "OO!", &fast, &PyBytes_Type, &links)) {
        return NULL;
    }
    if (!PyList_Check(fast) && !PyTuple_Check(fast)) {
        PyErr_SetString(PyExc_TypeError, "_undo_touch_blocks expects a list or tuple");
        return NULL;
    }
    shift_counts(self, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast), -1);
    Py_ssize_t count = PyBytes_GET_SIZE(links) / (Py_ssize_t)(3 * sizeof(int32_t));
    relink(self, (const int32_t *)PyBytes_AS_STRING(links), count);
    self->num_free += count;
    Py_RETURN_NONE;
}

/* -- counts for a pool whose eviction policy keeps the free blocks ----------
 *
 * A core made with queue=False keeps the counts and the prefix map; the
 * pool's policy (a Python free queue) chooses and holds the free blocks. The
 * pool asks the policy first (take) or last (release, revive) and these
 * methods do the rest of each step in C, journaling their own undo. */

/* Set a count of 1 on each block of list ``blocks``; -1 and an exception,
 * nothing changed, unless each is a valid id with no reference, listed once. */
static int
claim_counts(Core *self, PyObject *blocks)
{
    Py_ssize_t count = PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block = block_of(self, PyList_GET_ITEM(blocks, i));
        if (block >= 0 && self->ref[block] != 0) {
            PyErr_Format(PyExc_RuntimeError,
                         "the eviction policy handed out block %d, which is in use "
                         "or listed twice",
                         block);
            block = -1;
        }
        if (block < 0) {
            for (Py_ssize_t j = 0; j < i; j++) {
                self->ref[list_block(blocks, j)] = 0;
            }
            return -1;
        }
        self->ref[block] = 1;
    }
    return 0;
}

/* Hold each block of list ``blocks`` once and evict the hashes they carried
 * (``evict``); 0, or -1 with an exception (nothing changed, or journaled steps
 * that undo what did). */
static int
claim(Core *self, PyObject *blocks, int evict, PyObject *uncache, PyObject *removed)
{
    if (check_bound(self) < 0) {
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(blocks);
    if (count > self->num_free) {
        PyErr_Format(PyExc_ValueError, "cannot claim %zd blocks: only %zd are free", count,
                     self->num_free);
        return -1;
    }
    if (claim_counts(self, blocks) < 0) {
        return -1;
    }
    if (journaling(self) &&
        journal_append(self, "_undo_claim_blocks", PyTuple_Pack(1, blocks)) < 0) {
        for (Py_ssize_t i = 0; i < count; i++) {
            self->ref[list_block(blocks, i)] = 0;
        }
        return -1;
    }
    self->num_free -= count;
    if (evict) {
        return self->keyed ? evict_taken_digests(self, blocks, uncache, removed)
                           : evict_taken(self, blocks, uncache, removed);
    }
    return 0;
}

static PyObject *
Core_claim_blocks(Core *self, PyObject *args)
{
    PyObject *blocks, *uncache, *removed;
    int evict;
    if (!PyArg_ParseTuple(args, "O!pOO", &PyList_Type, &blocks, &evict, &uncache, &removed) ||
        claim(self, blocks, evict, uncache, removed) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Core_undo_claim_blocks(Core *self, PyObject *blocks)
{
    if (!PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "_undo_claim_blocks expects a list");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        int32_t block = block_of(self, PyList_GET_ITEM(blocks, i));
        if (block < 0) {
            return NULL;
        }
        self->ref[block] = 0;
    }
    self->num_free += PyList_GET_SIZE(blocks);
    Py_RETURN_NONE;
}

static PyObject *
Core_drop_blocks(Core *self, PyObject *blocks)
{
    PyObject *fast = PySequence_Fast(blocks, "drop_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Freed freed;
    if (freed_init(&freed, size) < 0) {
        Py_DECREF(fast);
        return NULL;
    }
    PyObject *released = release_counts(self, fast, &freed);
    if (released != NULL && journaling(self) &&
        journal_append(self, "_undo_drop_blocks", Py_BuildValue("(On)", fast, freed.count)) < 0) {
        unrelease(self, items, size);
        Py_CLEAR(released);
    }
    if (released != NULL) {
        self->num_free += freed.count;
    }
    freed_clear(&freed);
    Py_DECREF(fast);
    return released;
}

/* Undo of drop_blocks and adopt_blocks: ``sign`` counts back on each block of
 * ``fast``, and ``freed`` blocks fewer (or more) free. */
static PyObject *
undo_counts(Core *self, PyObject *args, int sign, const char *name)
{
    PyObject *fast;
    Py_ssize_t freed;
    if (!PyArg_ParseTuple(args, "On", &fast, &freed)) {
        return NULL;
    }
    if (!PyList_Check(fast) && !PyTuple_Check(fast)) {
        PyErr_Format(PyExc_TypeError, "%s expects a list or tuple", name);
        return NULL;
    }
    shift_counts(self, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast), sign);
    self->num_free -= sign * freed;
    Py_RETURN_NONE;
}

static PyObject *
Core_undo_drop_blocks(Core *self, PyObject *args)
{
    return undo_counts(self, args, 1, "_undo_drop_blocks");
}

static PyObject *
Core_adopt_blocks(Core *self, PyObject *blocks)
{
    PyObject *fast = PySequence_Fast(blocks, "adopt_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Py_ssize_t *positions = PyMem_Malloc((size_t)(size ? size : 1) * sizeof(Py_ssize_t));
    /* No links: the pool's policy, not this core, takes the free ones out. */
    Py_ssize_t freed = positions == NULL ? -1 : take_counts(self, items, size, NULL, positions);
    if (positions == NULL) {
        PyErr_NoMemory();
    }
    PyObject *revived = freed < 0 ? NULL : items_at(items, positions, freed);
    if (freed >= 0 &&
        (revived == NULL ||
         (journaling(self) && journal_append(self, "_undo_adopt_blocks",
                                             Py_BuildValue("(On)", fast, freed)) < 0))) {
        shift_counts(self, items, size, -1);
        freed = -1;
    }
    PyMem_Free(positions);
    Py_DECREF(fast);
    if (freed < 0) {
        Py_XDECREF(revived);
        return NULL;
    }
    self->num_free -= freed;
    return revived;
}

static PyObject *
Core_undo_adopt_blocks(Core *self, PyObject *args)
{
    return undo_counts(self, args, -1, "_undo_adopt_blocks");
}

/* -- for the compiled value queue (kvcore/_value_queue.c) ------------------ */

int
kv_is_core(PyObject *object)
{
    return PyObject_TypeCheck(object, &CoreType);
}

int
kv_core_claim(PyObject *core, PyObject *blocks, int evict, PyObject *uncache, PyObject *removed)
{
    return claim((Core *)core, blocks, evict, uncache, removed);
}

PyObject *
kv_core_drop(PyObject *core, PyObject *blocks)
{
    return Core_drop_blocks((Core *)core, blocks);
}

PyObject *
kv_core_adopt(PyObject *core, PyObject *blocks)
{
    return Core_adopt_blocks((Core *)core, blocks);
}

PyObject *
kv_core_block_object(PyObject *core, int32_t block)
{
    return block_object((Core *)core, block);
}

void
kv_core_set_journal(PyObject *core, PyObject *journal)
{
    Py_INCREF(journal);
    Py_SETREF(((Core *)core)->journal, journal);
}

int
kv_core_entry_like(PyObject *object, int32_t block, int group, int32_t *entry)
{
    Core *self = (Core *)object;
    if (check_bound(self) < 0) {
        return -1;
    }
    if (block < 0 || block >= self->n || group < 0 || group >= PyList_GET_SIZE(self->dups)) {
        PyErr_Format(PyExc_IndexError, "block %d or group %d is not of this pool", block, group);
        return -1;
    }
    if (self->keyed) {
        if (!dt_carries(&self->map, block)) {
            return 0;
        }
        int32_t found = dt_find(&self->map, group_bytes(self), (unsigned)group,
                                dt_digest(&self->map, block));
        *entry = found;
        return found >= 0;
    }
    PyObject *hash = PyList_GET_ITEM(self->hashes, block);
    if (hash == Py_None) {
        return 0;
    }
    PyObject *item = PyDict_GetItemWithError(PyList_GET_ITEM(self->maps, group), hash);
    if (item == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int32_t found = block_of(self, item);
    *entry = found;
    return found < 0 ? -1 : 1;
}

static PyObject *
Core_count_evictable(Core *self, PyObject *blocks)
{
    PyObject *fast = PySequence_Fast(blocks, "count_evictable() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t count = 0;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        int32_t block = block_of(self, items[i]);
        if (block < 0) {
            Py_DECREF(fast);
            return NULL;
        }
        count += block && self->ref[block] == 0;
    }
    Py_DECREF(fast);
    return PyLong_FromSsize_t(count);
}

/* The block id at ``item`` if it is an exact int naming a block of the pool
 * other than the null block, else 0 (no exception). */
static inline Py_ssize_t
cacheable_block_of(Core *self, PyObject *item)
{
    if (!PyLong_CheckExact(item)) {
        return 0;
    }
    Py_ssize_t block = int_value(item);
    if (block == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* past Py_ssize_t: not a block */
        return 0;
    }
    return block > 0 && block < self->n ? block : 0;
}

/* BlockPool.holds_cached, with its order of checks (so that the same inputs
 * raise the same errors): every entry an exact int naming a non-null block;
 * then the hashes compared position by position, stopping at the first that
 * differs (a comparison raising TypeError answers False, any other error is
 * raised); then every block's group. */
static int
holds_cached(Core *self, PyObject **blocks, PyObject **hashes, Py_ssize_t count, long group)
{
    /* Each id read once (three passes read them). */
    int32_t *ids = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(int32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int result = 1;
    for (Py_ssize_t i = 0; result > 0 && i < count; i++) {
        ids[i] = (int32_t)cacheable_block_of(self, blocks[i]);
        result = ids[i] != 0;
    }
    for (Py_ssize_t i = 0; result > 0 && self->keyed && i < count; i++) {
        const unsigned char *digest = key_digest(self, hashes[i]);
        result = digest != NULL && dt_carries(&self->map, ids[i]) &&
                 dt_same(&self->map, dt_digest(&self->map, ids[i]), digest);
    }
    for (Py_ssize_t i = 0; result > 0 && !self->keyed && i < count; i++) {
        PyObject *held = PyList_GET_ITEM(self->hashes, ids[i]);
        result = PyObject_RichCompareBool(held, hashes[i], Py_EQ);
        if (result < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            result = 0;
        }
    }
    const unsigned char *groups = group_bytes(self);
    for (Py_ssize_t i = 0; result > 0 && i < count; i++) {
        result = (long)groups[ids[i]] == group;
    }
    PyMem_Free(ids);
    return result;
}

static PyObject *
Core_holds_cached(Core *self, PyObject *args)
{
    PyObject *blocks, *hashes, *group_obj;
    if (!PyArg_ParseTuple(args, "OOO", &blocks, &hashes, &group_obj) || check_bound(self) < 0) {
        return NULL;
    }
    PyObject *fast_blocks = PySequence_Fast(blocks, "holds_cached() expects a sequence of blocks");
    if (fast_blocks == NULL) {
        return NULL;
    }
    PyObject *fast_hashes = PySequence_Fast(hashes, "holds_cached() expects a sequence of hashes");
    if (fast_hashes == NULL) {
        Py_DECREF(fast_blocks);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast_blocks);
    /* A group that is no group of the pool matches no block (-1). */
    long group = -1;
    if (PyLong_CheckExact(group_obj)) {
        group = PyLong_AsLong(group_obj);
        if (group == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        if (group >= (self->keyed ? (long)self->map.num_groups : PyList_GET_SIZE(self->maps))) {
            group = -1;
        }
    }
    int result = 0;
    if (count == PySequence_Fast_GET_SIZE(fast_hashes)) {
        result = holds_cached(self, PySequence_Fast_ITEMS(fast_blocks),
                              PySequence_Fast_ITEMS(fast_hashes), count, group);
    }
    Py_DECREF(fast_blocks);
    Py_DECREF(fast_hashes);
    if (result < 0) {
        return NULL;
    }
    return PyBool_FromLong(result);
}

/* The run of hits of hashes[start:stop] in one map. */
static PyObject *
match_one(PyObject *map, PyObject **hashes, Py_ssize_t start, Py_ssize_t stop)
{
    PyObject *hits = PyList_New(0);
    for (Py_ssize_t i = start; hits != NULL && i < stop; i++) {
        PyObject *block = PyDict_GetItemWithError(map, hashes[i]);
        if (block == NULL) {
            if (PyErr_Occurred()) {
                Py_CLEAR(hits);
            }
            break;
        }
        if (PyList_Append(hits, block) < 0) {
            Py_CLEAR(hits);
        }
    }
    return hits;
}

/* The run of hashes found in every one of ``maps`` (a tuple of dicts), one list per map. */
static PyObject *
match_all(PyObject *maps, PyObject **hashes, Py_ssize_t start, Py_ssize_t stop)
{
    Py_ssize_t width = PyTuple_GET_SIZE(maps);
    PyObject *out = PyTuple_New(width);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t g = 0; g < width; g++) {
        PyObject *hits = PyList_New(0);
        if (hits == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, g, hits);
    }
    for (Py_ssize_t i = start; i < stop; i++) {
        for (Py_ssize_t g = 0; g < width; g++) {
            if (PyDict_GetItemWithError(PyTuple_GET_ITEM(maps, g), hashes[i]) == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
                return out;
            }
        }
        for (Py_ssize_t g = 0; g < width; g++) {
            PyObject *block = PyDict_GetItem(PyTuple_GET_ITEM(maps, g), hashes[i]);
            if (PyList_Append(PyTuple_GET_ITEM(out, g), block) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

/* match_digests over a tuple of group ids (each checked). */
static PyObject *
match_digest_groups(Core *self, PyObject **hashes, Py_ssize_t start, Py_ssize_t stop,
                    PyObject *group_ids)
{
    Py_ssize_t width = PyTuple_GET_SIZE(group_ids), groups[256];
    if (width > 256) {
        PyErr_SetString(PyExc_ValueError, "match_prefix(): at most 256 group ids");
        return NULL;
    }
    for (Py_ssize_t g = 0; g < width; g++) {
        groups[g] = map_group(self, PyTuple_GET_ITEM(group_ids, g));
        if (groups[g] < 0) {
            return NULL;
        }
    }
    return match_digests(self, hashes, start, stop, groups, width);
}

static PyObject *
Core_match_prefix(Core *self, PyObject *args)
{
    PyObject *hashes, *group_ids;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OnnO", &hashes, &start, &stop, &group_ids) ||
        check_bound(self) < 0) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(hashes, "match_prefix() expects a sequence of hashes");
    PyObject *groups = fast == NULL ? NULL : PySequence_Tuple(group_ids);
    if (groups == NULL) {
        Py_XDECREF(fast);
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    start = start < 0 ? 0 : (start > size ? size : start);
    stop = stop > size ? size : (stop < start ? start : stop);
    Py_ssize_t width = PyTuple_GET_SIZE(groups);
    if (self->keyed) {
        PyObject *out = match_digest_groups(self, PySequence_Fast_ITEMS(fast), start, stop, groups);
        Py_DECREF(groups);
        Py_DECREF(fast);
        return out;
    }
    PyObject *maps = PyTuple_New(width);
    for (Py_ssize_t g = 0; maps != NULL && g < width; g++) {
        Py_ssize_t group = PyLong_AsSsize_t(PyTuple_GET_ITEM(groups, g));
        if (group < 0 || group >= PyList_GET_SIZE(self->maps)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_IndexError, "group %zd is not a group of this pool", group);
            }
            Py_CLEAR(maps);
            break;
        }
        PyObject *map = PyList_GET_ITEM(self->maps, group);
        Py_INCREF(map);
        PyTuple_SET_ITEM(maps, g, map);
    }
    PyObject *out = NULL;
    if (maps != NULL && width == 1) {
        PyObject *hits = match_one(PyTuple_GET_ITEM(maps, 0), PySequence_Fast_ITEMS(fast),
                                   start, stop);
        out = hits == NULL ? NULL : PyTuple_Pack(1, hits);
        Py_XDECREF(hits);
    }
    else if (maps != NULL) {
        out = match_all(maps, PySequence_Fast_ITEMS(fast), start, stop);
    }
    Py_XDECREF(maps);
    Py_DECREF(groups);
    Py_DECREF(fast);
    return out;
}

/* Put ``block`` in the cache under ``hash`` in ``group`` (block is not cached). */
static int
enter_one(Core *self, PyObject *item, int32_t block, PyObject *hash, Py_ssize_t group,
          int several_groups)
{
    PyObject *map = PyList_GET_ITEM(self->maps, group);
    PyObject *first = PyDict_SetDefault(map, hash, item);
    if (first == NULL) {
        return -1;
    }
    Py_ssize_t entry = PyLong_AsSsize_t(first);
    if (entry == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (entry != block) {
        PyObject *empty = PyList_New(0);
        PyObject *waiting = empty == NULL ? NULL
                            : PyDict_SetDefault(PyList_GET_ITEM(self->dups, group), hash, empty);
        Py_XDECREF(empty);
        if (waiting == NULL || PyList_Append(waiting, item) < 0) {
            return -1;
        }
    }
    Py_INCREF(hash);
    PyList_SetItem(self->hashes, block, hash);
    if (several_groups) {
        ((unsigned char *)PyByteArray_AS_STRING(self->groups))[block] = (unsigned char)group;
    }
    return 0;
}

static PyObject *
Core_enter(Core *self, PyObject *args)
{
    PyObject *blocks, *hashes;
    Py_ssize_t group;
    int several_groups;
    if (!PyArg_ParseTuple(args, "OOnp", &blocks, &hashes, &group, &several_groups) ||
        check_bound(self) < 0) {
        return NULL;
    }
    Py_ssize_t num_groups = self->keyed ? (Py_ssize_t)self->map.num_groups
                                        : PyList_GET_SIZE(self->maps);
    if (group < 0 || group >= num_groups) {
        PyErr_Format(PyExc_IndexError, "group %zd is not a group of this pool", group);
        return NULL;
    }
    PyObject *fast_blocks = PySequence_Fast(blocks, "enter() expects a sequence of block ids");
    PyObject *fast_hashes =
        fast_blocks == NULL ? NULL : PySequence_Fast(hashes, "enter() expects a sequence of hashes");
    if (fast_hashes == NULL) {
        Py_XDECREF(fast_blocks);
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast_blocks);
    int failed = size != PySequence_Fast_GET_SIZE(fast_hashes);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "enter(): one hash a block");
    }
    PyObject **items = PySequence_Fast_ITEMS(fast_blocks);
    PyObject **keys = PySequence_Fast_ITEMS(fast_hashes);
    Py_ssize_t entered = 0;
    if (!failed && self->keyed) {
        failed = enter_digests(self, items, keys, size, group, several_groups, &entered) < 0;
        size = 0;
    }
    for (Py_ssize_t i = 0; i < size && !failed; i++) {
        int32_t block = block_of(self, items[i]);
        failed = block < 0 || (block && enter_one(self, items[i], block, keys[i], group,
                                                  several_groups) < 0);
        entered += block > 0;
    }
    Py_DECREF(fast_blocks);
    Py_DECREF(fast_hashes);
    if (failed) {
        return NULL;
    }
    return PyLong_FromSsize_t(entered);
}

/* -- attributes and the buffer of reference counts ------------------------- */

static PyObject *
Core_get_journal(Core *self, void *closure)
{
    Py_INCREF(self->journal);
    return self->journal;
}

static int
Core_set_journal(Core *self, PyObject *value, void *closure)
{
    if (value == NULL || (value != Py_None && !PyList_CheckExact(value))) {
        PyErr_SetString(PyExc_TypeError, "journal must be a list or None");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->journal, value);
    return 0;
}

static PyObject *
Core_get_num_free(Core *self, void *closure)
{
    return PyLong_FromSsize_t(self->num_free);
}

static int
Core_set_num_free(Core *self, PyObject *value, void *closure)
{
    Py_ssize_t count = value == NULL ? -1 : PyLong_AsSsize_t(value);
    if (count == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (count < 0 || count > self->n) {
        PyErr_Format(PyExc_ValueError, "num_free must be in 0..%zd", self->n);
        return -1;
    }
    self->num_free = count;
    return 0;
}

static PyObject *
Core_get_num_hashed(Core *self, void *closure)
{
    return check_keyed(self) < 0 ? NULL : PyLong_FromSize_t(self->map.num_carried);
}

static PyObject *
Core_get_nbytes(Core *self, void *closure)
{
    /* The counts, and with a free queue its two links a block (plus the sentinel's). */
    size_t links = (size_t)self->n + (self->next == NULL ? 0 : 2 * (size_t)self->n + 2);
    return PyLong_FromSize_t(links * sizeof(int32_t) + (self->keyed ? dt_nbytes(&self->map) : 0));
}

static PyObject *
Core_get_id_objects(Core *self, void *closure)
{
    return Py_BuildValue("(nn)", self->num_id_objects, self->num_id_slots);
}

static int
Core_getbuffer(Core *self, Py_buffer *view, int flags)
{
    if (self->ref == NULL) {
        PyErr_SetString(PyExc_BufferError, "native pool core not initialised");
        view->obj = NULL;
        return -1;
    }
    /* One writable dimension of n int32 counts. */
    view->buf = self->ref;
    Py_INCREF(self);
    view->obj = (PyObject *)self;
    view->len = self->n * (Py_ssize_t)sizeof(int32_t);
    view->readonly = 0;
    view->itemsize = sizeof(int32_t);
    view->format = (flags & PyBUF_FORMAT) ? "i" : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &self->n : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &self->stride : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    self->exports++;
    return 0;
}

static void
Core_releasebuffer(Core *self, Py_buffer *view)
{
    self->exports--;
}

static PyBufferProcs Core_as_buffer = {
    (getbufferproc)Core_getbuffer,
    (releasebufferproc)Core_releasebuffer,
};

static PyGetSetDef Core_getset[] = {
    {"journal", (getter)Core_get_journal, (setter)Core_set_journal,
     "The pool's undo log while a transaction runs, else None.", NULL},
    {"num_free", (getter)Core_get_num_free, (setter)Core_set_num_free,
     "The pool's count of free blocks.", NULL},
    {"num_hashed", (getter)Core_get_num_hashed, NULL,
     "Blocks carrying a hash (the digest form).", NULL},
    {"nbytes", (getter)Core_get_nbytes, NULL,
     "Bytes of the core's arrays: counts, queue links and the digest map.", NULL},
    {"id_objects", (getter)Core_get_id_objects, NULL,
     "(held, slots): block-id int objects the core keeps, and the slots for them.", NULL},
    {NULL},
};

static PyMemberDef Core_members[] = {
    {"num_blocks", T_PYSSIZET, offsetof(Core, n), READONLY, "Blocks of the pool."},
    {NULL},
};

static PyMethodDef Core_methods[] = {
    {"bind", (PyCFunction)Core_bind, METH_VARARGS,
     "bind(hashes, maps, dups, groups): the pool's containers this core drives."},
    {"take", (PyCFunction)Core_take, METH_O, "FreeQueue.take: pop n blocks from the head."},
    {"release", (PyCFunction)Core_release, METH_O, "FreeQueue.release: append at the tail."},
    {"revive", (PyCFunction)Core_revive, METH_O, "FreeQueue.revive: unlink each block."},
    {"cached", (PyCFunction)Core_ignore, METH_VARARGS, "FreeQueue.cached: ignored by LRU."},
    {"hit", (PyCFunction)Core_ignore, METH_VARARGS, "FreeQueue.hit: ignored by LRU."},
    {"forget", (PyCFunction)Core_ignore, METH_VARARGS, "FreeQueue.forget: ignored by LRU."},
    {"queued", (PyCFunction)Core_queued, METH_NOARGS, "The queued blocks, head first."},
    {"is_queued", (PyCFunction)Core_is_queued, METH_O, "Whether a block is queued."},
    {"take_blocks", (PyCFunction)Core_take_blocks, METH_VARARGS,
     "take_blocks(n, evict, uncache, removed): n blocks held once, their hashes evicted."},
    {"release_blocks", (PyCFunction)Core_release_blocks, METH_O,
     "release_blocks(blocks): drop a count each; the blocks reaching 0 queued at the tail; "
     "returns how many."},
    {"touch_blocks", (PyCFunction)Core_touch_blocks, METH_O,
     "touch_blocks(blocks): take a count each; the free ones, unqueued and returned."},
    {"claim_blocks", (PyCFunction)Core_claim_blocks, METH_VARARGS,
     "claim_blocks(blocks, evict, uncache, removed): the policy's blocks held once, "
     "their hashes evicted."},
    {"drop_blocks", (PyCFunction)Core_drop_blocks, METH_O,
     "drop_blocks(blocks): drop a count each; the blocks reaching 0 (for the policy)."},
    {"adopt_blocks", (PyCFunction)Core_adopt_blocks, METH_O,
     "adopt_blocks(blocks): take a count each; the ones that were free (for the policy)."},
    {"count_evictable", (PyCFunction)Core_count_evictable, METH_O,
     "Non-null blocks among the given ones with no reference."},
    {"holds_cached", (PyCFunction)Core_holds_cached, METH_VARARGS,
     "holds_cached(blocks, hashes, group): each block cached in group under its hash."},
    {"match_prefix", (PyCFunction)Core_match_prefix, METH_VARARGS,
     "match_prefix(hashes, start, stop, groups): the run of hits, one list a group."},
    {"enter", (PyCFunction)Core_enter, METH_VARARGS,
     "enter(blocks, hashes, group, several_groups): cache blocks under hashes; returns how "
     "many were cached (the non-null ones)."},
    {"bind_digests", (PyCFunction)Core_bind_digests, METH_VARARGS,
     "bind_digests(width, dups, groups, int_keys=False): keep the prefix map here, hashes "
     "of width bytes (or ints of 8)."},
    {"hash_at", (PyCFunction)Core_hash_at, METH_O, "The hash a block carries, or None."},
    {"set_hash", (PyCFunction)Core_set_hash, METH_VARARGS,
     "set_hash(block, hash or None): the hash the block carries."},
    {"map_get", (PyCFunction)Core_map_get, METH_VARARGS,
     "map_get(group, hash): the entry block, or None."},
    {"map_set", (PyCFunction)Core_map_set, METH_VARARGS,
     "map_set(group, hash, block): make the block the entry of its hash."},
    {"map_del", (PyCFunction)Core_map_del, METH_VARARGS,
     "map_del(group, hash): remove the entry (KeyError if none)."},
    {"map_len", (PyCFunction)Core_map_len, METH_O, "Entries of one group."},
    {"map_items", (PyCFunction)Core_map_items, METH_O, "(hash, block) entries of one group."},
    {"clear_map", (PyCFunction)Core_clear_map, METH_NOARGS, "Forget every hash."},
    {"_undo_evict_digests", (PyCFunction)Core_undo_evict_digests, METH_VARARGS, NULL},
    {"_undo_take", (PyCFunction)Core_undo_take, METH_O, NULL},
    {"_undo_release", (PyCFunction)Core_undo_release, METH_O, NULL},
    {"_undo_unlink", (PyCFunction)Core_undo_unlink, METH_O, NULL},
    {"_undo_take_blocks", (PyCFunction)Core_undo_take_blocks, METH_O, NULL},
    {"_undo_evict", (PyCFunction)Core_undo_evict, METH_VARARGS, NULL},
    {"_undo_release_blocks", (PyCFunction)Core_undo_release_blocks, METH_VARARGS, NULL},
    {"_undo_touch_blocks", (PyCFunction)Core_undo_touch_blocks, METH_VARARGS, NULL},
    {"_undo_claim_blocks", (PyCFunction)Core_undo_claim_blocks, METH_O, NULL},
    {"_undo_drop_blocks", (PyCFunction)Core_undo_drop_blocks, METH_VARARGS, NULL},
    {"_undo_adopt_blocks", (PyCFunction)Core_undo_adopt_blocks, METH_VARARGS, NULL},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcore._native.Core",
    .tp_doc = "Core(num_blocks, double_free_error, *, queue=True): a pool's counts, prefix map "
              "and (with queue) its LRU free queue.",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_iter = (getiterfunc)Core_iter,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
    .tp_getset = Core_getset,
    .tp_as_buffer = &Core_as_buffer,
};

int
kv_add_core(PyObject *module)
{
    if (PyType_Ready(&CoreType) < 0) {
        return -1;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(module, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        return -1;
    }
    return 0;
}
