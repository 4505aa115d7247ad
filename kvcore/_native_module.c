/* kvcore._native: the module, made of the pool core (kvcore/_native.c) and
 * the value policies' queue (kvcore/_value_queue.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_native_core.h"
#include "_value_queue.h"

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcore._native",
    .m_doc = "The compiled twin of kvcore's block pool (see kvcore/_native_pool.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (kv_add_core(module) < 0 || kv_add_value_queue(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
