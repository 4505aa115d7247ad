/* Marker functions for callgrind: each calls its argument and returns the result.
 *
 * bench_native.py compiles this file at run time and runs the replay under
 * ``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=kvbench_*``:
 * instructions are counted only inside these calls, and callgrind's inclusive
 * count of each marker is the cost of one operation category.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MARK(name)                                                                     \
    __attribute__((noinline)) PyObject *name(PyObject *self, PyObject *call)          \
    {                                                                                  \
        return PyObject_CallNoArgs(call);                                              \
    }

MARK(kvbench_lookup)
MARK(kvbench_admission)
MARK(kvbench_decode)
MARK(kvbench_free)

static PyMethodDef methods[] = {
    {"lookup", (PyCFunction)kvbench_lookup, METH_O, NULL},
    {"admission", (PyCFunction)kvbench_admission, METH_O, NULL},
    {"decode", (PyCFunction)kvbench_decode, METH_O, NULL},
    {"free", (PyCFunction)kvbench_free, METH_O, NULL},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_callgrind_marks", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__callgrind_marks(void)
{
    return PyModule_Create(&module);
}
