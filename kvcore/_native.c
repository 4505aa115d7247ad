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
 * The prefix map stays in the pool's Python containers (the per-block hash
 * list, the per-group dicts hash -> block and hash -> duplicates, the group
 * bytearray), which bind() hands over and this module drives through the C
 * API: block hashes are whatever hashable objects the engine supplies, and a
 * dict lookup from C on a key whose hash is cached (bytes, int) costs about
 * as much as a probe of a table of our own would.
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
} Core;

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

/* The block id at ``item`` (a Python int), or -1 with an exception set. */
static inline int32_t
block_of(Core *self, PyObject *item)
{
    Py_ssize_t block = PyLong_AsSsize_t(item);
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
    if (self->hashes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "native pool core used before bind()");
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
    static char *keywords[] = {"num_blocks", "double_free_error", NULL};
    Py_ssize_t n;
    PyObject *double_free;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO", keywords, &n, &double_free)) {
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
    self->prev = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    self->next = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    if (self->ref == NULL || self->prev == NULL || self->next == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->n = n;
    self->stride = sizeof(int32_t);
    /* A fresh queue holds every block in id order, as the Python one. */
    for (Py_ssize_t block = 0; block <= n; block++) {
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
        PyObject *item = block == sentinel ? NULL : PyLong_FromLong(block);
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
        PyObject *item = PyLong_FromLong(block);
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
    PyObject *item = PyLong_FromLong(block);
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
        int32_t block = (int32_t)PyLong_AsSsize_t(PyList_GET_ITEM(blocks, i));
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
        self->ref[PyLong_AsLong(PyList_GET_ITEM(blocks, i))] = 1;
    }
    self->num_free -= count;
    if (evict && evict_taken(self, blocks, uncache, removed) < 0) {
        Py_DECREF(blocks);
        return NULL;
    }
    return blocks;
}

static PyObject *
Core_undo_take_blocks(Core *self, PyObject *blocks)
{
    if (!PyList_Check(blocks) || push_head(self, blocks) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_undo_take_blocks expects a list");
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        self->ref[PyLong_AsLong(PyList_GET_ITEM(blocks, i))] = 0;
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

/* Undo a partial release: one count back on each non-null block of items[0:walked]. */
static void
unrelease(Core *self, PyObject **items, Py_ssize_t walked)
{
    for (Py_ssize_t i = 0; i < walked; i++) {
        long block = PyLong_AsLong(items[i]);
        if (block > 0) {
            self->ref[block] += 1;
        }
    }
}

/* Drop a count on each block of ``fast``; collect those reaching 0 in ``released``. */
static int
drop_counts(Core *self, PyObject *fast, PyObject *released)
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
        if (count == 0 && PyList_Append(released, items[i]) < 0) {
            unrelease(self, items, i + 1);
            return -1;
        }
    }
    return 0;
}

static PyObject *
Core_release_blocks(Core *self, PyObject *blocks)
{
    PyObject *fast = PySequence_Fast(blocks, "release_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    PyObject *released = PyList_New(0);
    if (released == NULL || drop_counts(self, fast, released) < 0) {
        Py_XDECREF(released);
        Py_DECREF(fast);
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t count = PyList_GET_SIZE(released);
    int failed = append_tail(self, released) < 0;
    if (!failed && journaling(self) &&
        journal_append(self, "_undo_release_blocks", Py_BuildValue("(On)", fast, count)) < 0) {
        drop_tail(self, count);
        failed = 1;
    }
    if (failed) {
        unrelease(self, PySequence_Fast_ITEMS(fast), size);
        Py_DECREF(released);
        Py_DECREF(fast);
        return NULL;
    }
    self->num_free += count;
    Py_DECREF(fast);
    return released;
}

static PyObject *
Core_undo_release_blocks(Core *self, PyObject *args)
{
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

/* Take a count on each non-null block of items; unlink those that were free. */
static Py_ssize_t
take_counts(Core *self, PyObject **items, Py_ssize_t size, int32_t *links, PyObject *revived)
{
    Py_ssize_t unlinked = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t block = block_of(self, items[i]);
        int bad = block < 0;
        if (!bad && block && self->ref[block] == 0) {
            if (self->prev[block] == -1) {
                PyErr_Format(PyExc_RuntimeError, "free block %d is not queued", block);
                bad = 1;
            }
            else if (PyList_Append(revived, items[i]) < 0) {
                bad = 1;
            }
            else {
                unlink_recorded(self, block, links + 3 * unlinked++);
            }
        }
        if (bad) {
            for (Py_ssize_t j = 0; j < i; j++) {
                long back = PyLong_AsLong(items[j]);
                if (back > 0) {
                    self->ref[back] -= 1;
                }
            }
            relink(self, links, unlinked);
            return -1;
        }
        if (block) {
            self->ref[block] += 1;
        }
    }
    return unlinked;
}

static PyObject *
Core_touch_blocks(Core *self, PyObject *blocks)
{
    PyObject *fast = PySequence_Fast(blocks, "touch_blocks() expects a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int32_t *links = PyMem_Malloc((size_t)(size ? size : 1) * 3 * sizeof(int32_t));
    PyObject *revived = PyList_New(0);
    Py_ssize_t unlinked = -1;
    if (links == NULL || revived == NULL) {
        PyErr_NoMemory();
    }
    else {
        unlinked = take_counts(self, items, size, links, revived);
    }
    if (unlinked >= 0 && journaling(self) &&
        journal_unlinks(self, "_undo_touch_blocks", fast, links, unlinked) < 0) {
        for (Py_ssize_t j = 0; j < size; j++) {
            long back = PyLong_AsLong(items[j]);
            if (back > 0) {
                self->ref[back] -= 1;
            }
        }
        unlinked = -1;
    }
    PyMem_Free(links);
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
    PyObject *fast, *links;
    if (!PyArg_ParseTuple(args, "OO!", &fast, &PyBytes_Type, &links)) {
        return NULL;
    }
    if (!PyList_Check(fast) && !PyTuple_Check(fast)) {
        PyErr_SetString(PyExc_TypeError, "_undo_touch_blocks expects a list or tuple");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        long block = PyLong_AsLong(items[i]);
        if (block > 0 && block < self->n) {
            self->ref[block] -= 1;
        }
    }
    Py_ssize_t count = PyBytes_GET_SIZE(links) / (Py_ssize_t)(3 * sizeof(int32_t));
    relink(self, (const int32_t *)PyBytes_AS_STRING(links), count);
    self->num_free += count;
    Py_RETURN_NONE;
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
    Py_ssize_t block = PyLong_AsSsize_t(item);
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
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!cacheable_block_of(self, blocks[i])) {
            return 0;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *held = PyList_GET_ITEM(self->hashes, cacheable_block_of(self, blocks[i]));
        int same = PyObject_RichCompareBool(held, hashes[i], Py_EQ);
        if (same < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return 0;
        }
        if (same <= 0) {
            return same;
        }
    }
    const char *groups = PyByteArray_AS_STRING(self->groups);
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((long)(unsigned char)groups[cacheable_block_of(self, blocks[i])] != group) {
            return 0;
        }
    }
    return 1;
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
        if (group >= PyList_GET_SIZE(self->maps)) {
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
    if (group < 0 || group >= PyList_GET_SIZE(self->maps)) {
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
    for (Py_ssize_t i = 0; i < size && !failed; i++) {
        int32_t block = block_of(self, items[i]);
        failed = block < 0 || (block && enter_one(self, items[i], block, keys[i], group,
                                                  several_groups) < 0);
    }
    Py_DECREF(fast_blocks);
    Py_DECREF(fast_hashes);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
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
     "release_blocks(blocks): drop a count each; the blocks reaching 0, queued."},
    {"touch_blocks", (PyCFunction)Core_touch_blocks, METH_O,
     "touch_blocks(blocks): take a count each; the free ones, unqueued and returned."},
    {"count_evictable", (PyCFunction)Core_count_evictable, METH_O,
     "Non-null blocks among the given ones with no reference."},
    {"holds_cached", (PyCFunction)Core_holds_cached, METH_VARARGS,
     "holds_cached(blocks, hashes, group): each block cached in group under its hash."},
    {"match_prefix", (PyCFunction)Core_match_prefix, METH_VARARGS,
     "match_prefix(hashes, start, stop, groups): the run of hits, one list a group."},
    {"enter", (PyCFunction)Core_enter, METH_VARARGS,
     "enter(blocks, hashes, group, several_groups): cache blocks under hashes."},
    {"_undo_take", (PyCFunction)Core_undo_take, METH_O, NULL},
    {"_undo_release", (PyCFunction)Core_undo_release, METH_O, NULL},
    {"_undo_unlink", (PyCFunction)Core_undo_unlink, METH_O, NULL},
    {"_undo_take_blocks", (PyCFunction)Core_undo_take_blocks, METH_O, NULL},
    {"_undo_evict", (PyCFunction)Core_undo_evict, METH_VARARGS, NULL},
    {"_undo_release_blocks", (PyCFunction)Core_undo_release_blocks, METH_VARARGS, NULL},
    {"_undo_touch_blocks", (PyCFunction)Core_undo_touch_blocks, METH_VARARGS, NULL},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcore._native.Core",
    .tp_doc = "Core(num_blocks, double_free_error): a pool's counts and LRU free queue.",
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

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcore._native",
    .m_doc = "The compiled twin of kvcore's block pool (see kvcore/_native_pool.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&CoreType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(module, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
