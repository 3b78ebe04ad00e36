/* portable_softmax._fastlaunch: the compiled repeat-call launcher.
 *
 * A Launcher holds the launches of one plan (function handle, grid, block, dynamic shared
 * memory and the kernel parameters) and replays them with new array pointers and a stream per
 * call: the buffers it is told to take per call (its pointer slots: x and y by default, dy, y
 * and dx for a gradient), in that order, then the stream. It calls the vendor's launch entry points through function pointers that
 * Python hands over, so this file includes no CUDA or HIP header and links no GPU library:
 * cuLaunchKernel (CUDA driver) and hipModuleLaunchKernel (HIP) share one C signature, and so do
 * cuLaunchCooperativeKernel and hipModuleLaunchCooperativeKernel, which cooperative steps take
 * (blocks that wait on each other: the launch guarantees they are all resident at once).
 *
 * Every call builds its kernel parameters on the C stack, so threads may call one Launcher at
 * once without a lock, and the launches run with the GIL released (a launch may block while the
 * device's launch queue is full).
 *
 * For tests without a GPU the module also provides a recording stub with the entry point's
 * signature (it keeps the last calls and the bytes behind every kernel parameter) and an error
 * stub that fails every launch.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <stdint.h>
#include <string.h>

/* Bumped whenever the Python side must change with this file (portable_softmax/_launch.py). */
#define FASTLAUNCH_ABI 3
/* Kernel parameters per launch: the planner's kernels take at most a dozen. */
#define MAX_ARGS 64
/* Buffers given per call (pointer slots). */
#define MAX_POINTERS 8
/* What the error stub returns: no CUDA or HIP status has this value. */
#define ERROR_STUB_CODE 999
/* Calls the recording stub keeps (the oldest are dropped first). */
#define RECORD_CAPACITY 4096

/* cuLaunchKernel and hipModuleLaunchKernel: CUresult and hipError_t are C enums (int). */
typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shared_bytes, void *stream, void **kernel_params,
                         void **extra);
/* cuLaunchCooperativeKernel and hipModuleLaunchCooperativeKernel: the same without `extra`. */
typedef int (*cooperative_launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                     unsigned by, unsigned bz, unsigned shared_bytes, void *stream,
                                     void **kernel_params);

/* One kernel parameter as the kernel reads it. Every slot is 8 bytes wide and the value sits at
 * its start, so a 4-byte read of an i32 slot sees the i32 on any byte order. */
typedef union {
    void *ptr;
    int64_t i64;
    int32_t i32;
    unsigned char bytes[8];
} slot;

/* A parameter's role: FIXED, or 1 + the index of the pointer slot it takes per call. */
enum { FIXED = 0 };

typedef struct {
    void *f;
    unsigned grid[3], block[3], shared;
    int cooperative;                /* launched through the cooperative entry point */
    int nargs;
    slot values[MAX_ARGS];          /* the fixed values; pointer slots are filled per call */
    unsigned char roles[MAX_ARGS];  /* FIXED, or 1 + a pointer slot's index */
} step;

typedef struct {
    PyObject_HEAD
    launch_fn launch;
    cooperative_launch_fn cooperative;  /* NULL where none was given */
    Py_ssize_t nsteps;
    step *steps;
    PyObject *names;     /* tuple of str: the kernels, for error messages */
    PyObject *pointers;  /* tuple of str: the buffers given per call, in the call's order */
    Py_ssize_t npointers;
    PyObject *describe;  /* None or callable(code) -> str, called only when a launch fails */
} Launcher;

static PyObject *LaunchError;  /* RuntimeError subclass with .kernel, .code and .step */

/* ---- construction (not the hot path) ------------------------------------------------------- */

static int as_uint(PyObject *obj, unsigned *out, const char *what, unsigned long lowest) {
    unsigned long v;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    v = PyLong_AsUnsignedLong(obj);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must lie in [%lu, 2**32 - 1]", what, lowest);
        return -1;
    }
    if (v < lowest || v > 0xFFFFFFFFul) {
        PyErr_Format(PyExc_ValueError, "%s must lie in [%lu, 2**32 - 1]", what, lowest);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int as_address(PyObject *obj, uintptr_t *out, const char *what) {
    unsigned long long v;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int address", what);
        return -1;
    }
    v = PyLong_AsUnsignedLongLong(obj);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an address in [0, 2**%d - 1]", what,
                     (int)(8 * sizeof(uintptr_t)));
        return -1;
    }
    *out = (uintptr_t)v;
    return 0;
}

/* An int (x) or a sequence of 1 to 3 ints (x, y, z); missing dimensions are 1. */
static int as_dims(PyObject *obj, unsigned out[3], const char *what) {
    Py_ssize_t n, i;
    out[0] = out[1] = out[2] = 1;
    if (PyLong_Check(obj))
        return as_uint(obj, &out[0], what, 1);
    n = PySequence_Check(obj) ? PySequence_Size(obj) : -1;
    if (n < 1 || n > 3) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an int or a sequence of 1 to 3 ints", what);
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        int rc = item ? as_uint(item, &out[i], what, 1) : -1;
        Py_XDECREF(item);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* One (kind, value) argument: kind "ptr" takes an int address or the name of a pointer slot
 * (filled per call), "i64" and "i32" take ints in their range. */
static int parse_arg(PyObject *arg, step *s, int i, PyObject *name, PyObject *pointers) {
    PyObject *kind = NULL, *value = NULL;
    int rc = -1;
    if (!PySequence_Check(arg) || PySequence_Size(arg) != 2) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%U: argument %d must be a (kind, value) pair", name, i);
        return -1;
    }
    kind = PySequence_GetItem(arg, 0);
    value = PySequence_GetItem(arg, 1);
    if (!kind || !value)
        goto done;
    memset(&s->values[i], 0, sizeof(slot));
    s->roles[i] = FIXED;
    if (!PyUnicode_Check(kind)) {
        PyErr_Format(PyExc_TypeError, "%U: argument %d's kind must be 'ptr', 'i64' or 'i32'", name, i);
    } else if (PyUnicode_CompareWithASCIIString(kind, "ptr") == 0) {
        uintptr_t address;
        if (PyUnicode_Check(value)) {
            Py_ssize_t k, n = PyTuple_Size(pointers);
            for (k = 0; k < n; k++) {
                if (PyUnicode_Compare(value, PyTuple_GetItem(pointers, k)) == 0) {
                    s->roles[i] = (unsigned char)(1 + k);
                    rc = 0;
                    break;
                }
            }
            if (rc != 0)
                PyErr_Format(PyExc_KeyError, "%U: argument %d names buffer %R; only %R are given per "
                             "call, other buffers need an address", name, i, value, pointers);
        } else if (as_address(value, &address, "a 'ptr' argument") == 0) {
            s->values[i].ptr = (void *)address;
            rc = 0;
        }
    } else if (PyUnicode_CompareWithASCIIString(kind, "i64") == 0) {
        long long v = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
        if (!PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError, "%U: argument %d (i64) must be an int", name, i);
        } else if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "%U: argument %d (i64) = %R does not fit 64 bits", name, i, value);
        } else {
            s->values[i].i64 = (int64_t)v;
            rc = 0;
        }
    } else if (PyUnicode_CompareWithASCIIString(kind, "i32") == 0) {
        long long v = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
        if (!PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError, "%U: argument %d (i32) must be an int", name, i);
        } else if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "%U: argument %d (i32) = %R does not fit 32 bits", name, i, value);
        } else {
            s->values[i].i32 = (int32_t)v;
            rc = 0;
        }
    } else {
        PyErr_Format(PyExc_ValueError, "%U: argument %d has unknown kind %R", name, i, kind);
    }
done:
    Py_XDECREF(kind);
    Py_XDECREF(value);
    return rc;
}

/* (name, function, grid, block, shared_bytes, args[, cooperative]) */
static int parse_step(PyObject *item, step *s, PyObject **name_out, PyObject *pointers) {
    PyObject *fields[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    Py_ssize_t i, nargs, nfields;
    uintptr_t f;
    int rc = -1;
    *name_out = NULL;
    nfields = PySequence_Check(item) ? PySequence_Size(item) : -1;
    if (nfields != 6 && nfields != 7) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "a step is (name, function, grid, block, shared_bytes, args[, cooperative])");
        return -1;
    }
    for (i = 0; i < nfields; i++)
        if (!(fields[i] = PySequence_GetItem(item, i)))
            goto done;
    if (!PyUnicode_Check(fields[0])) {
        PyErr_SetString(PyExc_TypeError, "a step's name must be a str");
        goto done;
    }
    if (as_address(fields[1], &f, "a step's function handle") < 0 ||
        as_dims(fields[2], s->grid, "grid") < 0 || as_dims(fields[3], s->block, "block") < 0 ||
        as_uint(fields[4], &s->shared, "shared_bytes", 0) < 0)
        goto done;
    s->f = (void *)f;
    s->cooperative = 0;
    if (nfields == 7) {
        if (!PyBool_Check(fields[6])) {
            PyErr_Format(PyExc_TypeError, "%U: cooperative must be a bool", fields[0]);
            goto done;
        }
        s->cooperative = fields[6] == Py_True;
    }
    nargs = PySequence_Check(fields[5]) ? PySequence_Size(fields[5]) : -1;
    if (nargs < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%U: args must be a sequence of (kind, value)", fields[0]);
        goto done;
    }
    if (nargs > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "%U takes %zd arguments; the launcher holds at most %d",
                     fields[0], nargs, MAX_ARGS);
        goto done;
    }
    s->nargs = (int)nargs;
    for (i = 0; i < nargs; i++) {
        PyObject *arg = PySequence_GetItem(fields[5], i);
        int bad = arg ? parse_arg(arg, s, (int)i, fields[0], pointers) : -1;
        Py_XDECREF(arg);
        if (bad)
            goto done;
    }
    Py_INCREF(fields[0]);
    *name_out = fields[0];
    rc = 0;
done:
    for (i = 0; i < 7; i++)
        Py_XDECREF(fields[i]);
    return rc;
}

/* describe is usually a bound method of a runtime adapter, which may come to hold launchers:
 * the collector must see that reference to break such a cycle. */
static int Launcher_traverse(PyObject *op, visitproc visit, void *arg) {
    Launcher *self = (Launcher *)op;
    Py_VISIT(Py_TYPE(op));  /* instances of heap types own a reference to their type */
    Py_VISIT(self->names);
    Py_VISIT(self->pointers);
    Py_VISIT(self->describe);
    return 0;
}

static int Launcher_clear(PyObject *op) {
    Launcher *self = (Launcher *)op;
    Py_CLEAR(self->names);
    Py_CLEAR(self->pointers);
    Py_CLEAR(self->describe);
    return 0;
}

static void Launcher_dealloc(PyObject *op) {
    Launcher *self = (Launcher *)op;
    PyTypeObject *tp = Py_TYPE(op);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    PyObject_GC_UnTrack(op);
    Launcher_clear(op);
    PyMem_Free(self->steps);
    tp_free(op);
    Py_DECREF(tp);
}

/* The pointer slots: None (x and y) or a sequence of 1 to MAX_POINTERS distinct str; a new tuple. */
static PyObject *as_pointers(PyObject *obj) {
    PyObject *t;
    Py_ssize_t n, i, j;
    if (obj == Py_None)
        return Py_BuildValue("(ss)", "x", "y");
    t = PySequence_Check(obj) && !PyUnicode_Check(obj) ? PySequence_Tuple(obj) : NULL;
    if (!t) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "pointers must be a sequence of buffer names (str)");
        return NULL;
    }
    n = PyTuple_Size(t);
    if (n < 1 || n > MAX_POINTERS) {
        PyErr_Format(PyExc_ValueError, "pointers names %zd buffers; a launcher takes 1 to %d", n, MAX_POINTERS);
        Py_DECREF(t);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *a = PyTuple_GetItem(t, i);
        if (!PyUnicode_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "pointers must be a sequence of buffer names (str)");
            Py_DECREF(t);
            return NULL;
        }
        for (j = 0; j < i; j++) {
            if (PyUnicode_Compare(a, PyTuple_GetItem(t, j)) == 0) {
                PyErr_Format(PyExc_ValueError, "pointers names buffer %R twice", a);
                Py_DECREF(t);
                return NULL;
            }
        }
    }
    return t;
}

static PyObject *Launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"entry_point", "steps", "describe", "cooperative_entry_point", "pointers", NULL};
    PyObject *entry = NULL, *steps = NULL, *describe = Py_None, *cooperative_entry = Py_None;
    PyObject *pointers_arg = Py_None, *pointers;
    Launcher *self;
    uintptr_t address, cooperative_address = 0;
    Py_ssize_t n, i;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO$O:Launcher", keywords, &entry, &steps, &describe,
                                     &cooperative_entry, &pointers_arg))
        return NULL;
    if (as_address(entry, &address, "entry_point") < 0)
        return NULL;
    if (address == 0) {  /* calling it would crash the process */
        PyErr_SetString(PyExc_ValueError, "entry_point is a null address");
        return NULL;
    }
    if (cooperative_entry != Py_None) {
        if (as_address(cooperative_entry, &cooperative_address, "cooperative_entry_point") < 0)
            return NULL;
        if (cooperative_address == 0) {
            PyErr_SetString(PyExc_ValueError, "cooperative_entry_point is a null address (pass None)");
            return NULL;
        }
    }
    if (describe != Py_None && !PyCallable_Check(describe)) {
        PyErr_SetString(PyExc_TypeError, "describe must be None or a callable(code) -> str");
        return NULL;
    }
    n = PySequence_Check(steps) ? PySequence_Size(steps) : -1;
    if (n < 1) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "steps must be a non-empty sequence of launches");
        return NULL;
    }
    if (!(pointers = as_pointers(pointers_arg)))
        return NULL;
    self = (Launcher *)PyType_GenericAlloc(type, 0);
    if (!self) {
        Py_DECREF(pointers);
        return NULL;
    }
    self->pointers = pointers;  /* owns the reference */
    self->npointers = PyTuple_Size(pointers);
    self->launch = (launch_fn)address;
    self->cooperative = (cooperative_launch_fn)cooperative_address;
    self->nsteps = n;
    self->steps = PyMem_Calloc((size_t)n, sizeof(step));
    self->names = PyTuple_New(n);
    Py_INCREF(describe);
    self->describe = describe;
    if (!self->steps || !self->names) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(steps, i), *name = NULL;
        int bad = item ? parse_step(item, &self->steps[i], &name, self->pointers) : -1;
        Py_XDECREF(item);
        if (!bad && self->steps[i].cooperative && !self->cooperative) {
            PyErr_Format(PyExc_ValueError, "%U is a cooperative step, and no cooperative_entry_point "
                         "was given", name);
            Py_DECREF(name);
            bad = -1;
        }
        if (bad) {
            Py_DECREF(self);
            return NULL;
        }
        PyTuple_SetItem(self->names, i, name);  /* steals the reference */
    }
    return (PyObject *)self;
}

/* ---- the call ------------------------------------------------------------------------------- */

static PyObject *raise_launch_error(Launcher *self, Py_ssize_t failed, int code) {
    PyObject *name = self->names ? PyTuple_GetItem(self->names, failed) : NULL;
    PyObject *text = NULL, *message, *exc;
    if (!name) {  /* cleared by the collector: a launcher caught in a cycle that is being broken */
        PyErr_Clear();
        name = Py_None;
    }
    if (self->describe && self->describe != Py_None) {
        text = PyObject_CallFunction(self->describe, "i", code);
        if (!text || !PyUnicode_Check(text)) {  /* the description is a courtesy; the code is what counts */
            PyErr_Clear();
            Py_XDECREF(text);
            text = NULL;
        }
    }
    if (text)
        message = PyUnicode_FromFormat("launch %zd of %zd (%S) failed: error %d (%U)", failed + 1,
                                       self->nsteps, name, code, text);
    else
        message = PyUnicode_FromFormat("launch %zd of %zd (%S) failed: error %d", failed + 1,
                                       self->nsteps, name, code);
    Py_XDECREF(text);
    if (!message)
        return NULL;
    exc = PyObject_CallFunctionObjArgs(LaunchError, message, NULL);
    Py_DECREF(message);
    if (!exc)
        return NULL;
    {
        PyObject *code_obj = PyLong_FromLong(code), *step_obj = PyLong_FromSsize_t(failed);
        int bad = !code_obj || !step_obj || PyObject_SetAttrString(exc, "kernel", name) < 0 ||
                  PyObject_SetAttrString(exc, "code", code_obj) < 0 ||
                  PyObject_SetAttrString(exc, "step", step_obj) < 0;
        Py_XDECREF(code_obj);
        Py_XDECREF(step_obj);
        if (bad) {
            Py_DECREF(exc);
            return NULL;
        }
    }
    PyErr_SetObject(LaunchError, exc);
    Py_DECREF(exc);
    return NULL;
}

/* A per-call address: pointer slot `position`, or the stream where position is npointers. */
static int address_arg(Launcher *self, PyObject *obj, uintptr_t *out, Py_ssize_t position) {
    unsigned long long v;
    if (!PyLong_Check(obj)) {
        if (position < self->npointers)
            PyErr_Format(PyExc_TypeError, "%U_ptr must be an int", PyTuple_GetItem(self->pointers, position));
        else
            PyErr_SetString(PyExc_TypeError, "stream must be an int");
        return -1;
    }
    v = PyLong_AsUnsignedLongLong(obj);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > (unsigned long long)UINTPTR_MAX) {
        PyErr_Clear();
        if (position < self->npointers)
            PyErr_Format(PyExc_ValueError, "%U_ptr must be an address in [0, 2**%d - 1]",
                         PyTuple_GetItem(self->pointers, position), (int)(8 * sizeof(uintptr_t)));
        else
            PyErr_Format(PyExc_ValueError, "stream must be an address in [0, 2**%d - 1]",
                         (int)(8 * sizeof(uintptr_t)));
        return -1;
    }
    *out = (uintptr_t)v;
    return 0;
}

/* args: one address a pointer slot, then the stream (nargs checked by the caller). */
static PyObject *launch_all(Launcher *self, PyObject *const *args) {
    uintptr_t pointers[MAX_POINTERS], stream;
    Py_ssize_t i, failed = -1;
    int code = 0;
    for (i = 0; i < self->npointers; i++)
        if (address_arg(self, args[i], &pointers[i], i) < 0)
            return NULL;
    if (address_arg(self, args[self->npointers], &stream, self->npointers) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < self->nsteps; i++) {
        const step *s = &self->steps[i];
        slot values[MAX_ARGS];
        void *params[MAX_ARGS + 1];
        int j;
        for (j = 0; j < s->nargs; j++) {
            if (s->roles[j] != FIXED) {
                memset(&values[j], 0, sizeof(slot));
                values[j].ptr = (void *)pointers[s->roles[j] - 1];
            } else {
                values[j] = s->values[j];
            }
            params[j] = &values[j];
        }
        params[s->nargs] = NULL;  /* drivers read only the kernel's own count; the stub stops here */
        if (s->cooperative)
            code = self->cooperative(s->f, s->grid[0], s->grid[1], s->grid[2], s->block[0], s->block[1],
                                     s->block[2], s->shared, (void *)stream, params);
        else
            code = self->launch(s->f, s->grid[0], s->grid[1], s->grid[2], s->block[0], s->block[1],
                                s->block[2], s->shared, (void *)stream, params, NULL);
        if (code != 0) {
            failed = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed >= 0)
        return raise_launch_error(self, failed, code);
    Py_RETURN_NONE;
}

static PyObject *wrong_count(Launcher *self, Py_ssize_t given) {
    PyObject *sep, *joined;
    if (!self->pointers) {  /* cleared by the collector */
        PyErr_SetString(PyExc_RuntimeError, "the launcher was cleared");
        return NULL;
    }
    if (!(sep = PyUnicode_FromString("_ptr, ")))
        return NULL;
    joined = PyUnicode_Join(sep, self->pointers);
    Py_DECREF(sep);
    if (!joined)
        return NULL;
    PyErr_Format(PyExc_TypeError, "launch(%U_ptr, stream) takes %zd arguments (%zd given)", joined,
                 self->npointers + 1, given);
    Py_DECREF(joined);
    return NULL;
}

static PyObject *Launcher_launch(PyObject *op, PyObject *const *args, Py_ssize_t nargs) {
    Launcher *self = (Launcher *)op;
    if (nargs != self->npointers + 1 || !self->pointers)
        return wrong_count(self, nargs);
    return launch_all(self, args);
}

static PyObject *Launcher_call(PyObject *op, PyObject *args, PyObject *kwargs) {
    Launcher *self = (Launcher *)op;
    PyObject *items[MAX_POINTERS + 1];
    Py_ssize_t i, n;
    if (kwargs && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "a launcher takes positional arguments only");
        return NULL;
    }
    n = PyTuple_Size(args);
    if (n != self->npointers + 1 || !self->pointers)
        return wrong_count(self, n);
    for (i = 0; i < n; i++)
        items[i] = PyTuple_GetItem(args, i);  /* borrowed */
    return launch_all(self, items);
}

static PyObject *Launcher_repr(PyObject *op) {
    Launcher *self = (Launcher *)op;
    PyObject *sep, *joined, *r;
    if (!self->names)
        return PyUnicode_FromString("<_fastlaunch.Launcher (cleared)>");
    if (!(sep = PyUnicode_FromString(", ")))
        return NULL;
    joined = PyUnicode_Join(sep, self->names);
    Py_DECREF(sep);
    if (!joined)
        return NULL;
    r = PyUnicode_FromFormat("<_fastlaunch.Launcher of %zd launches: %U>", self->nsteps, joined);
    Py_DECREF(joined);
    return r;
}

static PyMethodDef Launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launcher_launch, METH_FASTCALL,
     "launch(x_ptr, y_ptr, stream) -> None\n\nRun every launch in order with these pointers (one a "
     "pointer slot, in the order of `pointers`) and stream. Bind it once (f = launcher.launch) for the "
     "cheapest call."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Launcher_slots[] = {
    {Py_tp_new, (void *)Launcher_new},
    {Py_tp_dealloc, (void *)Launcher_dealloc},
    {Py_tp_traverse, (void *)Launcher_traverse},
    {Py_tp_clear, (void *)Launcher_clear},
    {Py_tp_call, (void *)Launcher_call},
    {Py_tp_repr, (void *)Launcher_repr},
    {Py_tp_methods, (void *)Launcher_methods},
    {Py_tp_doc, (void *)
     "Launcher(entry_point, steps, describe=None, cooperative_entry_point=None, *, pointers=('x', 'y'))\n\n"
     "The launches of one plan, replayed per call with new array pointers and stream.\n"
     "entry_point: address of cuLaunchKernel or hipModuleLaunchKernel (or a stub).\n"
     "steps: (name, function, grid, block, shared_bytes, args[, cooperative]) per launch;\n"
     "args are the kernel's (kind, value) pairs, kind 'ptr' | 'i64' | 'i32', and a 'ptr'\n"
     "value is an int address or a name in pointers (taken from each call). Steps with cooperative\n"
     "True launch through cooperative_entry_point (cuLaunchCooperativeKernel or\n"
     "hipModuleLaunchCooperativeKernel, or a stub), which they then require.\n"
     "describe: optional callable(code) -> str that names a failed launch's error code.\n"
     "pointers: the buffers given per call (1 to 8 names), in the call's order.\n"
     "Calling it (or its .launch) with (x_ptr, y_ptr, stream), one address a name in\n"
     "pointers and then the stream, launches every step in order\n"
     "and raises LaunchError naming the kernel and the code when one fails."},
    {0, NULL},
};

static PyType_Spec Launcher_spec = {
    "portable_softmax._fastlaunch.Launcher",
    sizeof(Launcher),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    Launcher_slots,
};

/* ---- stubs for tests without a GPU ---------------------------------------------------------- */

typedef struct {
    uintptr_t f, stream, extra;
    unsigned grid[3], block[3], shared;
    int cooperative;  /* recorded by the cooperative stub */
    int nparams;
    unsigned char params[MAX_ARGS][sizeof(slot)];
} record;

static record records[RECORD_CAPACITY];
static unsigned long long record_count;  /* calls since the last reset */
static long long fail_from = -1;          /* calls with index >= this return fail_code */
static int fail_code;
static PyThread_type_lock record_lock;    /* the stub runs without the GIL */

static int record_call(int cooperative, void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    record *r;
    int i, rc = 0;
    PyThread_acquire_lock(record_lock, WAIT_LOCK);
    r = &records[record_count % RECORD_CAPACITY];
    r->cooperative = cooperative;
    r->f = (uintptr_t)f;
    r->stream = (uintptr_t)stream;
    r->extra = (uintptr_t)extra;
    r->grid[0] = gx, r->grid[1] = gy, r->grid[2] = gz;
    r->block[0] = bx, r->block[1] = by, r->block[2] = bz;
    r->shared = shared;
    /* Copy what each parameter points to now: the caller's values live on its stack. */
    for (i = 0; params && i < MAX_ARGS && params[i]; i++)
        memcpy(r->params[i], params[i], sizeof(slot));
    r->nparams = i;
    if (fail_from >= 0 && (long long)record_count >= fail_from)
        rc = fail_code;
    record_count++;
    PyThread_release_lock(record_lock);
    return rc;
}

static int recording_stub(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    return record_call(0, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

static int recording_cooperative_stub(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                      unsigned by, unsigned bz, unsigned shared, void *stream, void **params) {
    return record_call(1, f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}

static int error_stub(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)stream, (void)params, (void)extra;
    return ERROR_STUB_CODE;
}

static PyObject *recording_stub_address(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)&recording_stub);
}

static PyObject *recording_cooperative_stub_address(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)&recording_cooperative_stub);
}

static PyObject *error_stub_address(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)&error_stub);
}

static PyObject *reset_recording(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fail_from", "code", NULL};
    long long from = -1;
    int code = 1;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Li:_reset_recording", keywords, &from, &code))
        return NULL;
    PyThread_acquire_lock(record_lock, WAIT_LOCK);
    record_count = 0;
    fail_from = from;
    fail_code = code;
    PyThread_release_lock(record_lock);
    Py_RETURN_NONE;
}

static PyObject *dims_tuple(const unsigned d[3]) {
    return Py_BuildValue("(kkk)", (unsigned long)d[0], (unsigned long)d[1], (unsigned long)d[2]);
}

static PyObject *recorded(PyObject *module, PyObject *unused) {
    PyObject *out = PyList_New(0);
    unsigned long long first, k;
    (void)module, (void)unused;
    if (!out)
        return NULL;
    PyThread_acquire_lock(record_lock, WAIT_LOCK);
    first = record_count > RECORD_CAPACITY ? record_count - RECORD_CAPACITY : 0;
    for (k = first; k < record_count; k++) {
        const record *r = &records[k % RECORD_CAPACITY];
        PyObject *params = PyTuple_New(r->nparams), *entry = NULL;
        int i, bad = !params;
        for (i = 0; !bad && i < r->nparams; i++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)r->params[i], sizeof(slot));
            bad = !b || PyTuple_SetItem(params, i, b) < 0;
        }
        if (!bad) {
            PyObject *grid = dims_tuple(r->grid), *block = dims_tuple(r->block);
            if (grid && block)
                entry = Py_BuildValue("{s:N,s:O,s:O,s:k,s:N,s:O,s:N,s:O}",
                                      "function", PyLong_FromVoidPtr((void *)r->f),
                                      "grid", grid, "block", block,
                                      "shared_bytes", (unsigned long)r->shared,
                                      "stream", PyLong_FromVoidPtr((void *)r->stream),
                                      "params", params,
                                      "extra", PyLong_FromVoidPtr((void *)r->extra),
                                      "cooperative", r->cooperative ? Py_True : Py_False);
            Py_XDECREF(grid);
            Py_XDECREF(block);
        }
        Py_XDECREF(params);
        if (!entry || PyList_Append(out, entry) < 0) {
            Py_XDECREF(entry);
            PyThread_release_lock(record_lock);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(entry);
    }
    PyThread_release_lock(record_lock);
    return out;
}

static PyMethodDef module_methods[] = {
    {"_recording_stub_address", recording_stub_address, METH_NOARGS,
     "Address of a launch entry point that records each call (see _recorded) and returns 0."},
    {"_recording_cooperative_stub_address", recording_cooperative_stub_address, METH_NOARGS,
     "Address of a cooperative launch entry point (no `extra`) that records each call, with\n"
     "cooperative True, in the same list as the recording stub, and returns 0."},
    {"_error_stub_address", error_stub_address, METH_NOARGS,
     "Address of a launch entry point that fails every call with ERROR_STUB_CODE."},
    {"_reset_recording", (PyCFunction)(void (*)(void))reset_recording, METH_VARARGS | METH_KEYWORDS,
     "_reset_recording(fail_from=-1, code=1): forget the recorded calls; from call index\n"
     "fail_from on (when >= 0) the recording stub returns code instead of 0."},
    {"_recorded", recorded, METH_NOARGS,
     "The recording stub's calls since the last reset, oldest first (at most RECORD_CAPACITY):\n"
     "dicts of function, grid, block, shared_bytes, stream, extra, cooperative (which stub\n"
     "took the call) and params, the 8 bytes behind each kernel parameter (an i32 occupies\n"
     "the first 4)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_fastlaunch",
    "The compiled repeat-call launcher: Launcher replays a plan's launches through\n"
    "cuLaunchKernel or hipModuleLaunchKernel (same C signature) given by address, and\n"
    "cooperative steps through cuLaunchCooperativeKernel or hipModuleLaunchCooperativeKernel.",
    -1,
    module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastlaunch(void) {
    PyObject *m, *launcher_type;
    if (!record_lock && !(record_lock = PyThread_allocate_lock()))
        return PyErr_NoMemory();
    m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    LaunchError = PyErr_NewExceptionWithDoc(
        "portable_softmax._fastlaunch.LaunchError",
        "A launch returned a non-zero status; .kernel, .code and .step (0-based) say which.",
        PyExc_RuntimeError, NULL);
    launcher_type = PyType_FromSpec(&Launcher_spec);
    if (!LaunchError || !launcher_type || PyModule_AddObjectRef(m, "LaunchError", LaunchError) < 0 ||
        PyModule_AddObjectRef(m, "Launcher", launcher_type) < 0 ||
        PyModule_AddIntConstant(m, "ABI", FASTLAUNCH_ABI) < 0 ||
        PyModule_AddIntConstant(m, "MAX_ARGS", MAX_ARGS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_POINTERS", MAX_POINTERS) < 0 ||
        PyModule_AddIntConstant(m, "ERROR_STUB_CODE", ERROR_STUB_CODE) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_CAPACITY", RECORD_CAPACITY) < 0) {
        Py_XDECREF(launcher_type);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(launcher_type);
    return m;
}
