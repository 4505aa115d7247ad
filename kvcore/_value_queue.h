/* kvcore._native.ValueQueue: the value policies' free queue, compiled (see _value_queue.c). */
#ifndef KVCORE_VALUE_QUEUE_H
#define KVCORE_VALUE_QUEUE_H

#include <Python.h>

/* Ready the ValueQueue type and add it to ``module``; 0, or -1 with an exception. */
int kv_add_value_queue(PyObject *module);

#endif
