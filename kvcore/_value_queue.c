/* kvcore._native.ValueQueue: the free queue of the "admit", "frequency" and
 * "cost" policies, compiled.
 *
 * The readable specification is kvcore/_eviction/policies.py (ValuePolicy:
 * the state byte of each block, its chain end, the class of a freed block)
 * and kvcore/_eviction/credit.py (CreditQueues: FIFO classes with deadlines,
 * the never-used run with its holes, joiners waiting behind their anchors).
 * This type keeps the same per-block state in flat arrays and makes the same
 * choices in the same order; the differential tests compare the two after
 * every step. One decision stays in Python, a callable of the policy's rules
 * (kvcore._eviction.policies.ValueRules): which suffix blocks of a prompt are
 * admitted (``admitted``, called once per cached prompt range of a suffix
 * group, never on a decode step). The prefix blocks a joiner waits behind
 * (its anchors: in each prefix group, the block cached under the joiner's
 * hash) are looked up in the pool core's prefix map, in C.
 *
 * Arrays, for n blocks and K classes (class 0 is WORTHLESS):
 *   next[b], prev[b]   links of the class lists; class k's sentinel is n + k
 *   klass[b]           the class of free block b, or NOT_FREE
 *   deadline[b]        the release clock plus the class's credit
 *   joiner[b], hole[b] flags (a joiner; a never-used block taken out early)
 *   state[b]           the policy's flags and hit count (see policies.py)
 *   end[b]             the token the chain of prefix block b ends at
 *
 * Undo: while ``journal`` is a list, take, release, revive and cached append
 * the compensating call the specification records (a release, a removal, a
 * release, a forget). Every method checks its arguments before it changes
 * anything, and one that fails part-way (a Python callable raising) undoes
 * its own changes first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_native_core.h"
#include "_value_queue.h"

#define NOT_FREE 255
#define WORTHLESS 0
#define JOIN 128
#define F_CACHED 1
#define F_SUFFIX 2
#define F_ADMITTED 4
#define HIT_STEP 32
#define HIT_SATURATED (7 * HIT_STEP)
#define DEPTH_SCALE 8192
#define NO_BOUND ((int64_t)1 << 62)
#define NO_ANCHOR (-1)
#define ANCHOR_ERROR (-2)

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int classes;
    int64_t *credits;
    int32_t *next;
    int32_t *prev;
    unsigned char *klass;
    int64_t *deadline;
    unsigned char *joiner;
    unsigned char *hole;
    unsigned char *mark; /* scratch for argument checks, all 0 between calls */
    Py_ssize_t fresh_start;
    Py_ssize_t fresh_end;
    int64_t clock;
    unsigned char *state;
    int32_t *end;
    int depth_levels;
    unsigned char *tables; /* depth_levels * 256 class bytes */
    Py_ssize_t groups;
    unsigned char *decode_flags;
    unsigned char *suffix;
    int32_t *block_sizes;
    PyObject *admitted;
    PyObject *core;         /* the pool's core: counts, and the map anchors are found in */
    int follow;             /* joiners wait behind their anchors */
    unsigned char *prefix;  /* the prefix groups, in order */
    Py_ssize_t num_prefix;
    PyObject *journal;
    /* The bound methods undo steps call, made on first use. */
    PyObject *undo_release;
    PyObject *undo_unrelease;
    PyObject *undo_forget;
} ValueQueue;

/* Arguments of at most this many blocks are converted on the stack. */
#define LOCAL_IDS 32

/* -- argument checks -------------------------------------------------------- */

static inline int
is_fresh(ValueQueue *q, Py_ssize_t block)
{
    return q->fresh_start <= block && block < q->fresh_end && !q->hole[block];
}

static inline int
is_free(ValueQueue *q, Py_ssize_t block)
{
    return q->klass[block] != NOT_FREE || is_fresh(q, block);
}

static inline void
free_ids(int32_t *ids, const int32_t *local)
{
    if (ids != local) {
        PyMem_Free(ids);
    }
}

/* The block ids of sequence ``blocks`` as a new int32 array (its length in
 * *count), each checked: in range, listed once, and free (``want_free`` 1),
 * not free (0) or either (-1). NULL with an exception otherwise. Up to
 * LOCAL_IDS ids go to ``local``; free the result with free_ids. */
static int32_t *
block_ids(ValueQueue *q, PyObject *blocks, Py_ssize_t *count, int want_free, int32_t *local)
{
    PyObject *fast = PySequence_Fast(blocks, "expected a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    int32_t *ids = size <= LOCAL_IDS ? local : PyMem_Malloc((size_t)size * sizeof(int32_t));
    if (ids == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t i = 0;
    for (; i < size; i++) {
        Py_ssize_t block = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (block == -1 && PyErr_Occurred()) {
            break;
        }
        if (block < 0 || block >= q->n) {
            PyErr_Format(PyExc_IndexError, "block %zd is not a block of this pool (ids 0..%zd)",
                         block, q->n - 1);
            break;
        }
        if (want_free >= 0 && q->mark[block]) {
            PyErr_Format(PyExc_ValueError, "block %zd is listed twice", block);
            break;
        }
        if (want_free >= 0 && is_free(q, block) != want_free) {
            PyErr_Format(PyExc_ValueError, want_free ? "block %zd is not free" : "block %zd is already free",
                         block);
            break;
        }
        q->mark[block] = 1;
        ids[i] = (int32_t)block;
    }
    for (Py_ssize_t j = 0; j < i; j++) {
        q->mark[ids[j]] = 0;
    }
    Py_DECREF(fast);
    if (i < size) {
        free_ids(ids, local);
        return NULL;
    }
    *count = size;
    return ids;
}

/* Append (self.<name>, (argument,)) to the journal when one runs; the bound
 * method is kept in *method once made. */
static int
journal_step(ValueQueue *q, PyObject **method, const char *name, PyObject *argument)
{
    if (q->journal == Py_None) {
        return 0;
    }
    if (*method == NULL && (*method = PyObject_GetAttrString((PyObject *)q, name)) == NULL) {
        return -1;
    }
    PyObject *step = Py_BuildValue("(O(O))", *method, argument);
    int failed = step == NULL || PyList_Append(q->journal, step) < 0;
    Py_XDECREF(step);
    return failed ? -1 : 0;
}

/* A list of the ``count`` block ids at ``ids``: the int objects its core
 * keeps for them, where the queue drives one. */
static PyObject *
id_list(ValueQueue *q, const int32_t *ids, Py_ssize_t count)
{
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *item = q->core != NULL ? kv_core_block_object(q->core, ids[i])
                                         : PyLong_FromLong(ids[i]);
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* -- the class lists (CreditQueues) ----------------------------------------- */

static inline int32_t
sentinel_of(ValueQueue *q, int klass)
{
    return (int32_t)(q->n + klass);
}

static inline void
unlink_block(ValueQueue *q, int32_t block)
{
    int32_t before = q->prev[block], after = q->next[block];
    q->next[before] = after;
    q->prev[after] = before;
}

static void
push(ValueQueue *q, int32_t block, int klass)
{
    if (klass) {
        q->clock += 1;
        q->deadline[block] = q->clock + q->credits[klass];
    }
    q->klass[block] = (unsigned char)klass;
    int32_t sentinel = sentinel_of(q, klass), tail = q->prev[sentinel];
    q->next[tail] = block;
    q->prev[block] = tail;
    q->next[block] = sentinel;
    q->prev[sentinel] = block;
}

/* Link joiner ``block`` right behind free ``anchor``: same class, same deadline. */
static void
insert_after(ValueQueue *q, int32_t block, int32_t anchor)
{
    q->klass[block] = q->klass[anchor];
    q->deadline[block] = q->deadline[anchor];
    q->joiner[block] = 1;
    int32_t after = q->next[anchor];
    q->next[anchor] = block;
    q->prev[block] = anchor;
    q->next[block] = after;
    q->prev[after] = block;
}

static void
remove_fresh(ValueQueue *q, int32_t block)
{
    if (block != q->fresh_start) {
        q->hole[block] = 1;
        return;
    }
    Py_ssize_t start = block + 1;
    while (start < q->fresh_end && q->hole[start]) {
        q->hole[start] = 0;
        start++;
    }
    q->fresh_start = start;
}

/* Take free ``block`` out of its class, or out of the never-used run. */
static void
remove_block(ValueQueue *q, int32_t block)
{
    if (is_fresh(q, block)) {
        remove_fresh(q, block);
        return;
    }
    unlink_block(q, block);
    q->klass[block] = NOT_FREE;
    q->joiner[block] = 0;
}

/* The first of joiner ``block``'s anchors free in a valued class and not
 * ``taken`` (NULL: none is); NO_ANCHOR, or ANCHOR_ERROR with an exception. */
static int32_t
free_anchor_of(ValueQueue *q, int32_t block, const unsigned char *taken)
{
    if (!q->follow) {
        return NO_ANCHOR;
    }
    for (Py_ssize_t i = 0; i < q->num_prefix; i++) {
        int32_t anchor;
        int found = kv_core_entry_like(q->core, block, q->prefix[i], &anchor);
        if (found < 0) {
            return ANCHOR_ERROR;
        }
        if (!found || anchor >= q->n) {
            continue;
        }
        unsigned char klass = q->klass[anchor];
        if (WORTHLESS < klass && klass < NOT_FREE && (taken == NULL || !taken[anchor])) {
            return anchor;
        }
    }
    return NO_ANCHOR;
}

/* -- taking ------------------------------------------------------------------ */

static Py_ssize_t
take_fresh(ValueQueue *q, Py_ssize_t n, int32_t *out)
{
    Py_ssize_t block = q->fresh_start, taken = 0;
    for (; taken < n && block < q->fresh_end; block++) {
        if (q->hole[block]) {
            q->hole[block] = 0;
        }
        else {
            out[taken++] = (int32_t)block;
        }
    }
    while (block < q->fresh_end && q->hole[block]) {
        q->hole[block] = 0;
        block++;
    }
    q->fresh_start = block;
    return taken;
}

static Py_ssize_t
take_worthless(ValueQueue *q, Py_ssize_t n, int32_t *out)
{
    int32_t sentinel = sentinel_of(q, WORTHLESS), block = q->next[sentinel];
    Py_ssize_t taken = 0;
    for (; taken < n && block != sentinel; block = q->next[block]) {
        out[taken++] = block;
        q->klass[block] = NOT_FREE;
    }
    q->next[sentinel] = block;
    q->prev[block] = sentinel;
    return taken;
}

/* The sentinel of the valued class due first (-1: all empty); *bound: the
 * deadline its run may reach (before the next head, or at it when the tie
 * goes to this class). */
static int32_t
earliest_class(ValueQueue *q, int64_t *bound)
{
    int32_t best = -1, second_sentinel = 0;
    int64_t best_deadline = 0, second = 0;
    int has_second = 0;
    for (int k = 1; k < q->classes; k++) {
        int32_t sentinel = sentinel_of(q, k), head = q->next[sentinel];
        if (head == sentinel) {
            continue;
        }
        int64_t due = q->deadline[head];
        if (best < 0 || due < best_deadline) {
            if (best >= 0) {
                second = best_deadline;
                second_sentinel = best;
                has_second = 1;
            }
            best = sentinel;
            best_deadline = due;
        }
        else if (!has_second || due < second) {
            second = due;
            second_sentinel = sentinel;
            has_second = 1;
        }
    }
    *bound = !has_second ? NO_BOUND : best > second_sentinel ? second - 1 : second;
    return best;
}

/* Take the run due first (up to n blocks) into out; how many, or -1 with an
 * exception. A joiner whose turn comes while its anchor is free moves behind
 * it and ends the run. */
static Py_ssize_t
take_valued_run(ValueQueue *q, Py_ssize_t n, int32_t *out)
{
    int64_t bound;
    int32_t best = earliest_class(q, &bound);
    if (best < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the value queue ran out of free blocks");
        return -1;
    }
    Py_ssize_t taken = 0;
    int32_t block = q->next[best];
    while (taken < n && block != best && q->deadline[block] <= bound) {
        if (q->joiner[block]) {
            q->joiner[block] = 0;
            int32_t anchor = free_anchor_of(q, block, NULL);
            if (anchor == ANCHOR_ERROR) {
                q->joiner[block] = 1;
                q->next[best] = block;
                q->prev[block] = best;
                return taken ? taken : -1; /* the caller gives back what was taken */
            }
            if (anchor != NO_ANCHOR) {
                q->next[best] = block;
                q->prev[block] = best;
                unlink_block(q, block);
                insert_after(q, block, anchor);
                return taken;
            }
        }
        out[taken++] = block;
        q->klass[block] = NOT_FREE;
        block = q->next[block];
    }
    q->next[best] = block;
    q->prev[block] = best;
    return taken;
}

static int release_ids(ValueQueue *q, const int32_t *ids, Py_ssize_t count);

static PyObject *
VQ_take(ValueQueue *q, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || n > q->n) {
        PyErr_Format(PyExc_ValueError, "take(n) needs 0 <= n <= %zd, got %zd", q->n, n);
        return NULL;
    }
    int32_t local[LOCAL_IDS];
    int32_t *out = n <= LOCAL_IDS ? local : PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (out == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t taken = take_fresh(q, n, out);
    if (taken < n) {
        taken += take_worthless(q, n - taken, out + taken);
    }
    int failed = 0;
    while (taken < n) {
        Py_ssize_t run = take_valued_run(q, n - taken, out + taken);
        if (run < 0 || PyErr_Occurred()) {
            taken += run > 0 ? run : 0;
            failed = 1;
            break;
        }
        taken += run;
    }
    PyObject *blocks = failed ? NULL : id_list(q, out, taken);
    if (blocks != NULL && journal_step(q, &q->undo_release, "release", blocks) < 0) {
        Py_CLEAR(blocks);
    }
    if (blocks == NULL) {
        /* Give the blocks back as the undo would: released, in order. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (release_ids(q, out, taken) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
        free_ids(out, local);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < taken; i++) {
        q->state[out[i]] = 0; /* a taken block starts over: no hash, never hit */
    }
    free_ids(out, local);
    return blocks;
}

/* -- releasing ---------------------------------------------------------------- */

/* Log2 depth class of the deepest cached prefix block among ids. */
static int
chain_depth_level(ValueQueue *q, const int32_t *ids, Py_ssize_t count)
{
    int32_t deepest = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((q->state[ids[i]] & (F_CACHED | F_SUFFIX)) == F_CACHED && q->end[ids[i]] > deepest) {
            deepest = q->end[ids[i]];
        }
    }
    int level = 0;
    for (int32_t scaled = deepest / DEPTH_SCALE; scaled; scaled >>= 1) {
        level++;
    }
    return level < q->depth_levels - 1 ? level : q->depth_levels - 1;
}

/* Queue ids (not free, distinct) in the class each one's state says, in
 * order; -1 with an exception (an anchors call failed), every change undone. */
static int
release_ids(ValueQueue *q, const int32_t *ids, Py_ssize_t count)
{
    int level = q->depth_levels > 1 ? chain_depth_level(q, ids, count) : 0;
    const unsigned char *table = q->tables + 256 * level;
    int64_t clock = q->clock;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block = ids[i];
        int klass = table[q->state[block]];
        if (klass < JOIN) {
            push(q, block, klass);
            continue;
        }
        int32_t anchor = free_anchor_of(q, block, NULL);
        if (anchor == ANCHOR_ERROR) {
            for (Py_ssize_t j = i - 1; j >= 0; j--) {
                remove_block(q, ids[j]);
            }
            q->clock = clock;
            return -1;
        }
        if (anchor == NO_ANCHOR) {
            push(q, block, klass - JOIN);
            q->joiner[block] = 1;
        }
        else {
            insert_after(q, block, anchor);
        }
    }
    return 0;
}

static PyObject *
VQ_release(ValueQueue *q, PyObject *blocks)
{
    Py_ssize_t count;
    int32_t local[LOCAL_IDS];
    int32_t *ids = block_ids(q, blocks, &count, 0, local);
    if (ids == NULL) {
        return NULL;
    }
    int failed = release_ids(q, ids, count) < 0;
    if (!failed && journal_step(q, &q->undo_unrelease, "_unrelease", blocks) < 0) {
        for (Py_ssize_t j = count - 1; j >= 0; j--) {
            remove_block(q, ids[j]);
        }
        failed = 1;
    }
    free_ids(ids, local);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Take free ids out of the queue, in the given order (or, with ``backwards``, reversed). */
static PyObject *
remove_blocks(ValueQueue *q, PyObject *blocks, int backwards, int journal)
{
    Py_ssize_t count;
    int32_t local[LOCAL_IDS];
    int32_t *ids = block_ids(q, blocks, &count, 1, local);
    if (ids == NULL) {
        return NULL;
    }
    /* Journaled first: the undo (a release) must not find them free. */
    if (journal && journal_step(q, &q->undo_release, "release", blocks) < 0) {
        free_ids(ids, local);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        remove_block(q, ids[backwards ? count - 1 - i : i]);
    }
    free_ids(ids, local);
    Py_RETURN_NONE;
}

static PyObject *
VQ_revive(ValueQueue *q, PyObject *blocks)
{
    return remove_blocks(q, blocks, 0, 1);
}

static PyObject *
VQ_unrelease(ValueQueue *q, PyObject *blocks)
{
    return remove_blocks(q, blocks, 1, 0);
}

/* -- notices ------------------------------------------------------------------ */

static PyObject *
VQ_hit(ValueQueue *q, PyObject *blocks)
{
    Py_ssize_t count;
    int32_t local[LOCAL_IDS];
    int32_t *ids = block_ids(q, blocks, &count, -1, local);
    if (ids == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block = ids[i];
        if (block && q->state[block] < HIT_SATURATED) {
            q->state[block] += HIT_STEP;
        }
    }
    free_ids(ids, local);
    Py_RETURN_NONE;
}

static PyObject *
VQ_forget(ValueQueue *q, PyObject *blocks)
{
    if (blocks == Py_None) {
        memset(q->state, 0, (size_t)q->n);
        Py_RETURN_NONE;
    }
    Py_ssize_t count;
    int32_t local[LOCAL_IDS];
    int32_t *ids = block_ids(q, blocks, &count, -1, local);
    if (ids == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t block = ids[i];
        q->state[block] = 0;
        unsigned char klass = q->klass[block];
        if (klass != WORTHLESS && klass != NOT_FREE) {
            /* To the worthless class's tail; a move is not a release. */
            unlink_block(q, block);
            push(q, block, WORTHLESS);
            q->joiner[block] = 0;
        }
    }
    free_ids(ids, local);
    Py_RETURN_NONE;
}

/* The admitted indices of a prompt range of a suffix group, from the rules
 * (each in [start, stop)), into a new array (length in *count); NULL with an
 * exception. */
static Py_ssize_t *
admitted_indices(ValueQueue *q, Py_ssize_t group, Py_ssize_t start, Py_ssize_t stop,
                 Py_ssize_t prompt, Py_ssize_t *count)
{
    PyObject *found = PyObject_CallFunction(q->admitted, "nnnn", group, start, stop, prompt);
    PyObject *fast = found == NULL ? NULL : PySequence_Fast(found, "admitted must be a sequence");
    Py_XDECREF(found);
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t *out = PyMem_Malloc((size_t)(size ? size : 1) * sizeof(Py_ssize_t));
    Py_ssize_t i = 0;
    for (; out != NULL && i < size; i++) {
        out[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] < start || out[i] >= stop) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "admitted index %zd is not in [%zd, %zd)", out[i],
                             start, stop);
            }
            break;
        }
    }
    Py_DECREF(fast);
    if (out == NULL || i < size) {
        PyMem_Free(out);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return NULL;
    }
    *count = size;
    return out;
}

/* The ids of ``blocks[start:stop]`` (each in range) as a new int32 array;
 * NULL with an exception, also when the range is not in the sequence. Up
 * to LOCAL_IDS ids go to ``local``; free the result with free_ids. */
static int32_t *
range_ids(ValueQueue *q, PyObject *blocks, Py_ssize_t start, Py_ssize_t stop, int32_t *local)
{
    PyObject *fast = PySequence_Fast(blocks, "expected a sequence of block ids");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(fast);
    int32_t *ids = NULL;
    if (start < 0 || start > stop || stop > size) {
        PyErr_Format(PyExc_IndexError, "cached range [%zd, %zd) is not in a table of %zd blocks",
                     start, stop, size);
    }
    else if (stop - start <= LOCAL_IDS) {
        ids = local;
    }
    else if ((ids = PyMem_Malloc((size_t)(stop - start) * sizeof(int32_t))) == NULL) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t i = start; ids != NULL && i < stop; i++) {
        Py_ssize_t block = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (block < 0 || block >= q->n) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_IndexError,
                             "block %zd is not a block of this pool (ids 0..%zd)", block,
                             q->n - 1);
            }
            free_ids(ids, local);
            ids = NULL;
            break;
        }
        ids[i - start] = (int32_t)block;
    }
    Py_DECREF(fast);
    return ids;
}

/* Journal the undo of a cached range: forget its non-null blocks. */
static int
journal_forget(ValueQueue *q, const int32_t *ids, Py_ssize_t count)
{
    if (q->journal == Py_None) {
        return 0;
    }
    int32_t local[LOCAL_IDS];
    int32_t *nonnull = count <= LOCAL_IDS ? local : PyMem_Malloc((size_t)count * sizeof(int32_t));
    if (nonnull == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (ids[i]) {
            nonnull[kept++] = ids[i];
        }
    }
    PyObject *undo = id_list(q, nonnull, kept);
    free_ids(nonnull, local);
    int failed = undo == NULL || journal_step(q, &q->undo_forget, "forget", undo) < 0;
    Py_XDECREF(undo);
    return failed ? -1 : 0;
}

/* Record the state (and chain end) of each block of a prompt range. */
static void
mark_cached(ValueQueue *q, Py_ssize_t group, const int32_t *ids, Py_ssize_t start,
            Py_ssize_t stop, const Py_ssize_t *admitted, Py_ssize_t num_admitted)
{
    Py_ssize_t size = q->block_sizes[group];
    int suffix = q->suffix[group];
    for (Py_ssize_t i = start; i < stop; i++) {
        if (q->depth_levels > 1 && !suffix) {
            q->end[ids[i - start]] = (int32_t)((i + 1) * size);
        }
        q->state[ids[i - start]] = suffix ? F_CACHED | F_SUFFIX : F_CACHED;
    }
    for (Py_ssize_t i = 0; i < num_admitted; i++) {
        q->state[ids[admitted[i] - start]] = F_CACHED | F_SUFFIX | F_ADMITTED;
    }
    q->state[0] = 0; /* a null block in the range is not cached */
}

static PyObject *
VQ_cached(ValueQueue *q, PyObject *args)
{
    Py_ssize_t group, start, stop, prompt;
    PyObject *blocks, *hashes;
    if (!PyArg_ParseTuple(args, "nOnnOn", &group, &blocks, &start, &stop, &hashes, &prompt)) {
        return NULL;
    }
    if (group < 0 || group >= q->groups) {
        PyErr_Format(PyExc_IndexError, "group %zd is not a group of this pool (0..%zd)", group,
                     q->groups - 1);
        return NULL;
    }
    int32_t local[LOCAL_IDS];
    int32_t *ids = range_ids(q, blocks, start, stop, local);
    if (ids == NULL) {
        return NULL;
    }
    Py_ssize_t size = q->block_sizes[group];
    /* One block past the prompt (a decode step's): never admitted. */
    int decode = stop - start == 1 && start * size >= prompt;
    Py_ssize_t num_admitted = 0, *admitted = NULL;
    int failed = 0;
    if (!decode && q->suffix[group] && start < stop) {
        admitted = admitted_indices(q, group, start, stop, prompt, &num_admitted);
        failed = admitted == NULL;
    }
    failed = failed || journal_forget(q, ids, stop - start) < 0;
    if (!failed && decode) {
        int32_t block = ids[0];
        if (block) {
            unsigned char flag = q->state[block] = q->decode_flags[group];
            if (q->depth_levels > 1 && flag == F_CACHED) {
                q->end[block] = (int32_t)(stop * size);
            }
        }
    }
    else if (!failed) {
        mark_cached(q, group, ids, start, stop, admitted, num_admitted);
    }
    PyMem_Free(admitted);
    free_ids(ids, local);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- the pool's operations: the core's counts and this queue in one call --- */

/* take_blocks(n, evict, uncache, removed): the n blocks due first, held once,
 * their hashes evicted (the core's claim_blocks). */
static PyObject *
VQ_take_blocks(ValueQueue *q, PyObject *args)
{
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 4) {
        PyErr_SetString(PyExc_TypeError, "take_blocks(n, evict, uncache, removed)");
        return NULL;
    }
    int evict = PyObject_IsTrue(PyTuple_GET_ITEM(args, 1));
    PyObject *blocks = evict < 0 ? NULL : VQ_take(q, PyTuple_GET_ITEM(args, 0));
    if (blocks != NULL && kv_core_claim(q->core, blocks, evict, PyTuple_GET_ITEM(args, 2),
                                        PyTuple_GET_ITEM(args, 3)) < 0) {
        /* The transaction's undo steps (journaled above) give the blocks back. */
        Py_CLEAR(blocks);
    }
    return blocks;
}

/* release_blocks(blocks): a count dropped on each; the blocks reaching 0 queued and returned. */
static PyObject *
VQ_release_blocks(ValueQueue *q, PyObject *blocks)
{
    PyObject *released = kv_core_drop(q->core, blocks);
    if (released == NULL || PyList_GET_SIZE(released) == 0) {
        return released;
    }
    PyObject *done = VQ_release(q, released);
    if (done == NULL) {
        Py_DECREF(released);
        return NULL;
    }
    Py_DECREF(done);
    return released;
}

/* touch_blocks(blocks): a count taken on each; the free ones unqueued and
 * returned; the hit counted. */
static PyObject *
VQ_touch_blocks(ValueQueue *q, PyObject *blocks)
{
    PyObject *revived = kv_core_adopt(q->core, blocks);
    PyObject *done = revived == NULL ? NULL
                     : PyList_GET_SIZE(revived) ? VQ_revive(q, revived)
                                                : Py_NewRef(Py_None);
    Py_XDECREF(done);
    done = done == NULL ? NULL : VQ_hit(q, blocks);
    if (done == NULL) {
        Py_XDECREF(revived);
        return NULL;
    }
    Py_DECREF(done);
    return revived;
}

/* -- inspection ---------------------------------------------------------------- */

static int
append_id(PyObject *out, int32_t block)
{
    PyObject *item = PyLong_FromLong(block);
    int failed = item == NULL || PyList_Append(out, item) < 0;
    Py_XDECREF(item);
    return failed ? -1 : 0;
}

/* Append the blocks of the valued classes to ``out`` in the order take would
 * hand them out: the earliest deadline first, a joiner whose anchor is still
 * to come right after that anchor. The rest are scratch: ``taken`` n zero
 * bytes, ``waiting`` and ``after`` n ids each, ``heads`` one id a class. 0, or
 * -1 with an exception. */
static int
append_by_deadline(ValueQueue *q, PyObject *out, unsigned char *taken, int32_t *waiting,
                   int32_t *after, int32_t *heads)
{
    memset(waiting, 0xff, (size_t)q->n * sizeof(int32_t)); /* anchor -> first waiting joiner */
    for (int k = 1; k < q->classes; k++) {
        int32_t s = sentinel_of(q, k);
        heads[k] = q->next[s] == s ? -1 : q->next[s];
    }
    for (;;) {
        int best = -1;
        for (int k = 1; k < q->classes; k++) {
            if (heads[k] >= 0 && (best < 0 || q->deadline[heads[k]] < q->deadline[heads[best]])) {
                best = k;
            }
        }
        if (best < 0) {
            return 0;
        }
        int32_t block = heads[best], following = q->next[block];
        heads[best] = following == sentinel_of(q, best) ? -1 : following;
        int32_t anchor = q->joiner[block] ? free_anchor_of(q, block, taken) : NO_ANCHOR;
        if (anchor == ANCHOR_ERROR) {
            return -1;
        }
        if (anchor != NO_ANCHOR) {
            after[block] = waiting[anchor]; /* the joiner -> the next one waiting */
            waiting[anchor] = block;
            continue;
        }
        if (append_id(out, block) < 0) {
            return -1;
        }
        taken[block] = 1;
        for (int32_t moved = waiting[block]; moved >= 0; moved = after[moved]) {
            if (append_id(out, moved) < 0) {
                return -1;
            }
            taken[moved] = 1;
        }
        waiting[block] = -1;
    }
}

/* The free blocks in the order take would hand them out, without changing
 * anything: never-used ones, worthless ones, then by deadline. */
static PyObject *
free_order(ValueQueue *q)
{
    size_t n = (size_t)q->n;
    unsigned char *taken = PyMem_Calloc(n, 1);
    int32_t *waiting = PyMem_Malloc(n * sizeof(int32_t));
    int32_t *after = PyMem_Malloc(n * sizeof(int32_t));
    int32_t *heads = PyMem_Malloc((size_t)q->classes * sizeof(int32_t));
    PyObject *out = PyList_New(0);
    int failed = taken == NULL || waiting == NULL || after == NULL || heads == NULL || out == NULL;
    if (failed && !PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t b = q->fresh_start; !failed && b < q->fresh_end; b++) {
        failed = !q->hole[b] && append_id(out, (int32_t)b) < 0;
    }
    int32_t sentinel = sentinel_of(q, WORTHLESS);
    for (int32_t b = failed ? sentinel : q->next[sentinel]; !failed && b != sentinel; b = q->next[b]) {
        failed = append_id(out, b) < 0;
    }
    failed = failed || append_by_deadline(q, out, taken, waiting, after, heads) < 0;
    PyMem_Free(taken);
    PyMem_Free(waiting);
    PyMem_Free(after);
    PyMem_Free(heads);
    if (failed) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
VQ_class_of(ValueQueue *q, PyObject *arg)
{
    Py_ssize_t block = PyLong_AsSsize_t(arg);
    if (block == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (block < 0 || block >= q->n) {
        PyErr_Format(PyExc_IndexError, "block %zd is not a block of this pool (ids 0..%zd)", block,
                     q->n - 1);
        return NULL;
    }
    return PyLong_FromLong(q->klass[block]);
}

static PyObject *
VQ_iter(ValueQueue *q)
{
    PyObject *blocks = free_order(q);
    if (blocks == NULL) {
        return NULL;
    }
    PyObject *iterator = PyObject_GetIter(blocks);
    Py_DECREF(blocks);
    return iterator;
}

/* -- the type ------------------------------------------------------------------- */

static int
check_tables(ValueQueue *q)
{
    for (int i = 0; i < 256 * q->depth_levels; i++) {
        int klass = q->tables[i] >= JOIN ? q->tables[i] - JOIN : q->tables[i];
        if (klass >= q->classes) {
            PyErr_Format(PyExc_ValueError, "tables: class %d of entry %d is not below %d", klass,
                         i, q->classes);
            return -1;
        }
    }
    return 0;
}

static int
copy_bytes(PyObject *source, const char *name, Py_ssize_t size, unsigned char **into)
{
    if (!PyBytes_Check(source) || (size >= 0 && PyBytes_GET_SIZE(source) != size)) {
        PyErr_Format(PyExc_ValueError, "%s must be bytes of length %zd", name, size);
        return -1;
    }
    *into = PyMem_Malloc((size_t)PyBytes_GET_SIZE(source) + 1);
    if (*into == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*into, PyBytes_AS_STRING(source), (size_t)PyBytes_GET_SIZE(source));
    return 0;
}

static int
init_groups(ValueQueue *q, PyObject *decode_flags, PyObject *suffix, PyObject *sizes)
{
    PyObject *fast = PySequence_Fast(sizes, "block_sizes must be a sequence");
    if (fast == NULL) {
        return -1;
    }
    q->groups = PySequence_Fast_GET_SIZE(fast);
    q->block_sizes = PyMem_Malloc((size_t)(q->groups ? q->groups : 1) * sizeof(int32_t));
    int failed = q->groups < 1 || q->block_sizes == NULL;
    if (q->groups < 1) {
        PyErr_SetString(PyExc_ValueError, "block_sizes needs one entry a group");
    }
    else if (q->block_sizes == NULL) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t g = 0; !failed && g < q->groups; g++) {
        long size = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, g));
        if (size < 1 || size > INT32_MAX) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "block_sizes[%zd] must be >= 1", g);
            }
            failed = 1;
        }
        else {
            q->block_sizes[g] = (int32_t)size;
        }
    }
    Py_DECREF(fast);
    return failed || copy_bytes(decode_flags, "decode_flags", q->groups, &q->decode_flags) < 0 ||
                   copy_bytes(suffix, "suffix_groups", q->groups, &q->suffix) < 0
               ? -1
               : 0;
}

static int
init_credits(ValueQueue *q, PyObject *credits)
{
    PyObject *fast = PySequence_Fast(credits, "credits must be a sequence");
    if (fast == NULL) {
        return -1;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    if (count < 1 || count >= JOIN) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "credits needs 1 to %d valued classes, got %zd", JOIN - 1,
                     count);
        return -1;
    }
    q->classes = (int)count + 1;
    q->credits = PyMem_Calloc((size_t)q->classes, sizeof(int64_t));
    int failed = q->credits == NULL;
    if (failed) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; !failed && k < count; k++) {
        q->credits[k + 1] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
        failed = q->credits[k + 1] == -1 && PyErr_Occurred();
    }
    Py_DECREF(fast);
    return failed ? -1 : 0;
}

static int
init_arrays(ValueQueue *q, int free_at_start)
{
    size_t n = (size_t)q->n, links = n + (size_t)q->classes;
    q->next = PyMem_Malloc(links * sizeof(int32_t));
    q->prev = PyMem_Malloc(links * sizeof(int32_t));
    q->klass = PyMem_Malloc(n);
    q->deadline = PyMem_Calloc(n, sizeof(int64_t));
    q->joiner = PyMem_Calloc(n, 1);
    q->hole = PyMem_Calloc(n, 1);
    q->mark = PyMem_Calloc(n, 1);
    q->state = PyMem_Calloc(n, 1);
    q->end = PyMem_Calloc(n, sizeof(int32_t));
    if (q->next == NULL || q->prev == NULL || q->klass == NULL || q->deadline == NULL ||
        q->joiner == NULL || q->hole == NULL || q->mark == NULL || q->state == NULL ||
        q->end == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(q->klass, NOT_FREE, n);
    for (int k = 0; k < q->classes; k++) {
        q->next[n + (size_t)k] = q->prev[n + (size_t)k] = (int32_t)(n + (size_t)k);
    }
    q->fresh_start = free_at_start ? 0 : q->n;
    q->fresh_end = q->n;
    return 0;
}

static int
VQ_init(ValueQueue *q, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"num_blocks",  "credits",  "free_at_start",  "tables",
                               "decode_flags", "suffix_groups", "block_sizes", "admitted",
                               "prefix_groups", "follow", "core", NULL};
    Py_ssize_t n;
    int free_at_start, follow;
    PyObject *credits, *tables, *decode_flags, *suffix, *sizes, *admitted, *prefix, *core;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOpSSSOOSpO", keywords, &n, &credits,
                                     &free_at_start, &tables, &decode_flags, &suffix, &sizes,
                                     &admitted, &prefix, &follow, &core)) {
        return -1;
    }
    if (q->state != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a value queue is initialised once");
        return -1;
    }
    if (n < 1 || n >= INT32_MAX - JOIN) {
        PyErr_Format(PyExc_ValueError, "num_blocks must be in 1..%d, got %zd", INT32_MAX - JOIN - 1,
                     n);
        return -1;
    }
    if (!PyCallable_Check(admitted) || !kv_is_core(core)) {
        PyErr_SetString(PyExc_TypeError, "admitted must be callable, core a kvcore._native.Core");
        return -1;
    }
    if (PyBytes_GET_SIZE(tables) < 256 || PyBytes_GET_SIZE(tables) % 256) {
        PyErr_SetString(PyExc_ValueError, "tables must be 256 bytes per depth level");
        return -1;
    }
    q->n = n;
    q->depth_levels = (int)(PyBytes_GET_SIZE(tables) / 256);
    if (init_credits(q, credits) < 0 || copy_bytes(tables, "tables", -1, &q->tables) < 0 ||
        check_tables(q) < 0 || init_groups(q, decode_flags, suffix, sizes) < 0 ||
        init_arrays(q, free_at_start) < 0 ||
        copy_bytes(prefix, "prefix_groups", -1, &q->prefix) < 0) {
        return -1;
    }
    q->num_prefix = PyBytes_GET_SIZE(prefix);
    for (Py_ssize_t i = 0; i < q->num_prefix; i++) {
        if (q->prefix[i] >= q->groups) {
            PyErr_Format(PyExc_ValueError, "prefix_groups: %d is not a group", q->prefix[i]);
            return -1;
        }
    }
    Py_INCREF(admitted);
    q->admitted = admitted;
    Py_INCREF(core);
    q->core = core;
    q->follow = follow;
    Py_INCREF(Py_None);
    q->journal = Py_None;
    return 0;
}

static int
VQ_traverse(ValueQueue *q, visitproc visit, void *arg)
{
    Py_VISIT(q->admitted);
    Py_VISIT(q->core);
    Py_VISIT(q->journal);
    Py_VISIT(q->undo_release);
    Py_VISIT(q->undo_unrelease);
    Py_VISIT(q->undo_forget);
    return 0;
}

static int
VQ_clear(ValueQueue *q)
{
    Py_CLEAR(q->admitted);
    Py_CLEAR(q->core);
    Py_CLEAR(q->journal);
    Py_CLEAR(q->undo_release);
    Py_CLEAR(q->undo_unrelease);
    Py_CLEAR(q->undo_forget);
    return 0;
}

static void
VQ_dealloc(ValueQueue *q)
{
    PyObject_GC_UnTrack(q);
    VQ_clear(q);
    void *arrays[] = {q->credits, q->next,  q->prev,         q->klass,  q->deadline,
                      q->joiner,  q->hole,  q->mark,         q->state,  q->end,
                      q->tables,  q->decode_flags, q->suffix, q->block_sizes, q->prefix};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) {
        PyMem_Free(arrays[i]);
    }
    Py_TYPE(q)->tp_free((PyObject *)q);
}

static int
check_ready(ValueQueue *q)
{
    if (q->state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "value queue used before __init__");
        return -1;
    }
    return 0;
}

/* Every method checks that the queue was initialised before it runs. */
#define READY(call)                        \
    {                                      \
        if (check_ready(q) < 0) {          \
            return NULL;                   \
        }                                  \
        return call;                       \
    }

static PyObject *M_take(ValueQueue *q, PyObject *a) READY(VQ_take(q, a))
static PyObject *M_release(ValueQueue *q, PyObject *a) READY(VQ_release(q, a))
static PyObject *M_revive(ValueQueue *q, PyObject *a) READY(VQ_revive(q, a))
static PyObject *M_unrelease(ValueQueue *q, PyObject *a) READY(VQ_unrelease(q, a))
static PyObject *M_hit(ValueQueue *q, PyObject *a) READY(VQ_hit(q, a))
static PyObject *M_forget(ValueQueue *q, PyObject *a) READY(VQ_forget(q, a))
static PyObject *M_cached(ValueQueue *q, PyObject *a) READY(VQ_cached(q, a))
static PyObject *M_class_of(ValueQueue *q, PyObject *a) READY(VQ_class_of(q, a))
static PyObject *M_take_blocks(ValueQueue *q, PyObject *a) READY(VQ_take_blocks(q, a))
static PyObject *M_release_blocks(ValueQueue *q, PyObject *a) READY(VQ_release_blocks(q, a))
static PyObject *M_touch_blocks(ValueQueue *q, PyObject *a) READY(VQ_touch_blocks(q, a))
static PyObject *M_iter(ValueQueue *q) READY(VQ_iter(q))

static PyObject *
VQ_get_journal(ValueQueue *q, void *closure)
{
    PyObject *journal = q->journal == NULL ? Py_None : q->journal;
    Py_INCREF(journal);
    return journal;
}

static int
VQ_set_journal(ValueQueue *q, PyObject *value, void *closure)
{
    if (value == NULL || (value != Py_None && !PyList_CheckExact(value))) {
        PyErr_SetString(PyExc_TypeError, "journal must be a list or None");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(q->journal, value);
    if (q->core != NULL) {
        kv_core_set_journal(q->core, value); /* one transaction: the queue's and the core's */
    }
    return 0;
}

static PyObject *
VQ_get_nbytes(ValueQueue *q, void *closure)
{
    size_t n = (size_t)q->n, links = 2 * (n + (size_t)q->classes) * sizeof(int32_t);
    /* class, joiner, hole, scratch and state bytes; deadline; chain end */
    return PyLong_FromSize_t(links + 5 * n + n * sizeof(int64_t) + n * sizeof(int32_t));
}

static PyGetSetDef VQ_getset[] = {
    {"journal", (getter)VQ_get_journal, (setter)VQ_set_journal,
     "The pool's undo log while a transaction runs, else None.", NULL},
    {"nbytes", (getter)VQ_get_nbytes, NULL, "Bytes of the per-block arrays.", NULL},
    {NULL},
};

static PyMethodDef VQ_methods[] = {
    {"take", (PyCFunction)M_take, METH_O, "FreeQueue.take: the n blocks due first."},
    {"release", (PyCFunction)M_release, METH_O,
     "FreeQueue.release: queue blocks in the class their value says."},
    {"revive", (PyCFunction)M_revive, METH_O, "FreeQueue.revive: a hit took free blocks back."},
    {"withdraw", (PyCFunction)M_revive, METH_O, "FreeQueue.withdraw: as revive."},
    {"hit", (PyCFunction)M_hit, METH_O, "FreeQueue.hit: count the hit on each block."},
    {"forget", (PyCFunction)M_forget, METH_O,
     "FreeQueue.forget: blocks without a hash are worthless (None: every block)."},
    {"cached", (PyCFunction)M_cached, METH_VARARGS,
     "FreeQueue.cached(group, blocks, start, stop, hashes, num_prompt_tokens)."},
    {"take_blocks", (PyCFunction)M_take_blocks, METH_VARARGS,
     "take_blocks(n, evict, uncache, removed): n blocks held once, their hashes evicted."},
    {"release_blocks", (PyCFunction)M_release_blocks, METH_O,
     "release_blocks(blocks): drop a count each; the blocks reaching 0, queued."},
    {"touch_blocks", (PyCFunction)M_touch_blocks, METH_O,
     "touch_blocks(blocks): take a count each; the free ones, unqueued and returned."},
    {"class_of", (PyCFunction)M_class_of, METH_O,
     "The credit class of a free block (0: worthless), or 255 if it is in none."},
    {"_unrelease", (PyCFunction)M_unrelease, METH_O, NULL},
    {NULL},
};

static PyTypeObject ValueQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcore._native.ValueQueue",
    .tp_doc = "ValueQueue(num_blocks, credits, free_at_start, tables, decode_flags, "
              "suffix_groups, block_sizes, admitted, prefix_groups, follow, core): the value "
              "policies' free queue.",
    .tp_basicsize = sizeof(ValueQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)VQ_init,
    .tp_dealloc = (destructor)VQ_dealloc,
    .tp_traverse = (traverseproc)VQ_traverse,
    .tp_clear = (inquiry)VQ_clear,
    .tp_iter = (getiterfunc)M_iter,
    .tp_methods = VQ_methods,
    .tp_getset = VQ_getset,
};

int
kv_add_value_queue(PyObject *module)
{
    if (PyType_Ready(&ValueQueueType) < 0) {
        return -1;
    }
    Py_INCREF(&ValueQueueType);
    if (PyModule_AddObject(module, "ValueQueue", (PyObject *)&ValueQueueType) < 0) {
        Py_DECREF(&ValueQueueType);
        return -1;
    }
    return 0;
}
