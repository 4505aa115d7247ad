/* The C API of kvcore._native's Core (kvcore/_native.c), for the parts of the
 * module built beside it: the module's init (kvcore/_native_module.c) and the
 * value policies' queue (kvcore/_value_queue.c), which drives a core. */
#ifndef KVCORE_NATIVE_CORE_H
#define KVCORE_NATIVE_CORE_H

#include <Python.h>

#include <stdint.h>

/* Ready the Core type and add it to ``module``; 0, or -1 with an exception. */
int kv_add_core(PyObject *module);

/* Whether ``object`` is a pool core; and the block of ``group`` that a lookup
 * of the hash ``block`` carries finds (1, *entry set), none (0: no hash, or
 * nothing cached under it), or -1 with an exception. */
int kv_is_core(PyObject *object);
int kv_core_entry_like(PyObject *object, int32_t block, int group, int32_t *entry);

/* The core's claim_blocks(blocks, evict, uncache, removed) (``blocks`` a
 * list; 0, or -1 with an exception), drop_blocks(blocks) and
 * adopt_blocks(blocks) (new references, or NULL with an exception), and its
 * journal set to ``journal`` (a list or None, checked by the caller). */
int kv_core_claim(PyObject *core, PyObject *blocks, int evict, PyObject *uncache,
                  PyObject *removed);
PyObject *kv_core_drop(PyObject *core, PyObject *blocks);
PyObject *kv_core_adopt(PyObject *core, PyObject *blocks);
void kv_core_set_journal(PyObject *core, PyObject *journal);

/* A new reference to the int object of ``block``, a block id of ``core``
 * (the one the core keeps for it where it keeps one), or NULL with an
 * exception. */
PyObject *kv_core_block_object(PyObject *core, int32_t block);

#endif
