/* A launch plan's repeated call in C: the agreement word, an output, the launch.
 *
 * commlab/collectives/_native.py compiles this file on first use (the C compiler and
 * Python headers Triton's own launcher needs) and builds one Entry per launch plan.
 * Entry.__call__(x, out) does what _plan.fast_call does after its dict lookup, without
 * the Python interpreter in between:
 *
 *   1. the agreement, run ahead (_ahead.Ahead.repeat's skip path): the block's lock,
 *      the conditions under which a repeat may skip the wait, the pending calls every
 *      peer has published (checked by digest), then our slot's sequence word;
 *   2. an output the plan owns that nobody holds (_outputs.Outputs.take), or a new one;
 *   3. the launch: one cuLaunchKernel with a parameter block laid out once (set_raw,
 *      collectives/_rawlaunch.py), else Triton's C launcher with the plan's integer
 *      arguments, on the raw current stream (GPU); or the plan's host launch (CPU).
 *
 * Dispatch sits in front of a public collective (runtime/_publish.py): it maps a call
 * form (the arguments after x, x's shape, dtype, device and contiguity) to the Entry of
 * the plan that served it, so a repeated call never enters the interpreter. A call form
 * online selection picks for (``algorithm="auto"``) carries a Budget: the calls its
 * Python side said run the current algorithm with nothing to decide (collectives/_adapt.py);
 * the Dispatch serves that many, counts them, then hands the call back to Python.
 *
 * An Entry returns None whenever the call is anything but that steady state (a first call, a
 * peer's digest that differs, a profiler or trace, another thread in the agreement, an
 * unaligned pointer, ...), having changed nothing the Python path would not change the
 * same way: the caller then takes _plan.fast_call, which raises what must be raised. The
 * Python objects (ControlBlock, Ahead, Outputs) stay the one owner of every state.
 *
 * records_brief reads call records where they lie in every rank's shared memory (online
 * selection's decision on CPU, runtime/records.py): a few microseconds where numpy's
 * dozen passes cost a decision some hundred on every rank's critical path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* the driver's entry points a raw launch calls (addresses from Python, ctypes) */
typedef int (*cu_launch_t)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shared, void *stream,
                           void **params, void **extra);
typedef int (*cu_ctx_t)(void **ctx);
typedef int (*cu_error_t)(int code, const char **text);
typedef int (*cu_capturing_t)(void *stream, int *status);
#define RAW_MAX 64  /* kernel parameters a raw launch lays out */

typedef struct {
    PyObject_HEAD
    /* agreement */
    PyObject *block;       /* runtime._control.ControlBlock */
    PyObject *ahead;       /* its Ahead */
    PyObject *record;      /* the plan's Record */
    PyObject *raw;         /* record.raw (bytes) */
    PyObject *sig;         /* record.sig */
    PyObject *digest;      /* record.digest (int) */
    long long dig;
    PyObject *peers;       /* tuple of peer ranks */
    PyObject *sync_hook;   /* _ahead.SYNC_HOOK (list) */
    PyObject *caller;      /* _ahead.CALLER (list) */
    long long ring, slot_words, state_base, state_words, checked_word, rank;
    /* objects the block and its Ahead keep for their lifetime (set once in __init__) */
    PyObject *acquire, *release;  /* block._lock's */
    PyObject *pending, *drains, *words;
    /* outputs */
    PyObject *tensors, *storages, *slots;  /* Outputs' lists */
    PyObject *take;        /* Outputs.take (bound): the Python path for a new output */
    PyObject *reuse;       /* _outputs.REUSE (list) */
    PyObject *use_storage; /* torch._C._storage_Use_Count */
    Py_ssize_t free_refs, free_storage_refs;  /* Py_REFCNT of an output only the list holds */
    /* launch */
    int device;            /* CUDA device index, -1: the CPU backend (host launch) */
    PyObject *launch;      /* GPU: the C launcher; CPU: host_launch(x, out) */
    PyObject *before, *middle, *after;  /* GPU: the launcher's arguments around ours */
    PyObject *ints;        /* GPU: the kernel's arguments after (x, out) */
    int x_aligned;
    PyObject *raw_stream;  /* torch._C._cuda_getCurrentRawStream */
    PyObject *capturing;   /* torch._C._cuda_isCurrentStreamCapturing */
    PyObject *hooked;      /* _launcher.hooked: a Triton launch hook is installed */
    PyObject *tracing;     /* trace.RECORDER: a recording is on (its .active) */
    PyObject *profiling;   /* torch.autograd._profiler_enabled */
    PyObject *launches;    /* runtime.records.LAUNCHES (list) */
    PyObject *book;        /* the plan's call records (Book) or None */
    PyObject *note_tail;   /* (op, algorithm, nbytes, dtype) for Book.note */
    long long hits;        /* calls this entry served (tests, benchmarks) */
    int retired;           /* its plan left the communicator: never serve again */
    int capture_choice;    /* "auto" chooses afresh inside a CUDA-graph capture */
    /* our own launch (set_raw); raw_n 0: Triton's launcher */
    int raw_n;             /* kernel parameters, (x, out) first */
    uint64_t raw_values[RAW_MAX];  /* each parameter's bytes, little-endian */
    unsigned raw_grid[3], raw_block, raw_shared;
    void *raw_function;    /* CUfunction */
    cu_launch_t raw_launch;
    cu_ctx_t raw_ctx;
    cu_error_t raw_error;
    cu_capturing_t raw_capturing;  /* cuStreamIsCapturing, 0: ask torch */
    PyObject *raw_owner;   /* keeps the compiled kernel (its module and function) loaded */
    long long raw_launches;  /* launches made by raw_fire (checks) */
    PyObject *site_code;   /* call_site's last (code, instruction) and its (file, line) */
    int site_lasti;
    PyObject *site;
} Entry;

static PyObject *s_seq, *s_enabled, *s_last, *s_entered, *s_mine, *s_last_published,
    *s_popleft, *s_append, *s_data_ptr, *s_use_count, *s_requires_grad, *s_note, *s_base,
    *s_shape, *s_dtype, *s_get_device, *s_is_contiguous, *s_active;

/* Every object an Entry holds, once: traverse and clear walk the same list. */
#define ENTRY_OBJECTS(X) \
    X(block) X(ahead) X(record) X(raw) X(sig) X(digest) X(peers) X(sync_hook) X(caller) \
    X(acquire) X(release) X(pending) X(drains) X(words) X(tensors) X(storages) X(slots) \
    X(take) X(reuse) X(use_storage) X(launch) X(before) X(middle) X(after) X(ints) \
    X(raw_stream) X(capturing) X(hooked) X(tracing) X(profiling) X(launches) X(book) \
    X(note_tail) X(raw_owner) X(site_code) X(site)

static int entry_traverse(Entry *self, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(self->f);
    ENTRY_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int entry_clear(Entry *self) {
#define CLEAR(f) Py_CLEAR(self->f);
    ENTRY_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void entry_dealloc(Entry *self) {
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Entry(block, record, peers, sync_hook, caller, layout, outputs, take, reuse,
 *       use_storage, free_refs, device, launch, before, middle, after, ints, x_aligned,
 *       raw_stream, capturing, hooked, tracing, launches, book, note_tail)
 * layout: (ring, slot_words, state_base, state_words, checked_word, rank);
 * outputs: (tensors, storages, slots); free_refs: (tensor, storage). */
static int entry_init(Entry *self, PyObject *args, PyObject *kw) {
    PyObject *block, *record, *peers, *sync_hook, *caller, *layout, *outputs, *take, *reuse,
        *use_storage, *free_refs, *launch, *before, *middle, *after, *ints, *raw_stream,
        *capturing, *hooked, *tracing, *profiling, *launches, *book, *note_tail;
    int device, x_aligned;
    if (self->block) {
        PyErr_SetString(PyExc_RuntimeError, "Entry: initialized once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOiOOOOOpOOOOOOOO", &block, &record, &peers,
                          &sync_hook, &caller, &layout, &outputs, &take, &reuse,
                          &use_storage, &free_refs, &device, &launch, &before, &middle,
                          &after, &ints, &x_aligned, &raw_stream, &capturing, &hooked,
                          &tracing, &profiling, &launches, &book, &note_tail))
        return -1;
    if (!PyArg_ParseTuple(layout, "LLLLLL", &self->ring, &self->slot_words, &self->state_base,
                          &self->state_words, &self->checked_word, &self->rank))
        return -1;
    if (!PyArg_ParseTuple(free_refs, "nn", &self->free_refs, &self->free_storage_refs))
        return -1;
    if (!PyTuple_Check(peers) || !PyTuple_Check(before) || !PyTuple_Check(middle)
        || !PyTuple_Check(after) || !PyTuple_Check(ints) || !PyTuple_Check(note_tail)) {
        PyErr_SetString(PyExc_TypeError, "Entry: peers, before, middle, after, ints and "
                        "note_tail must be tuples");
        return -1;
    }
    PyObject *tensors, *storages, *slots;
    if (!PyArg_ParseTuple(outputs, "O!O!O!", &PyList_Type, &tensors, &PyList_Type, &storages,
                          &PyList_Type, &slots))
        return -1;
    PyObject *lock = PyObject_GetAttrString(block, "_lock");
    if (!lock) return -1;
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = PyObject_GetAttrString(lock, "release");
    Py_DECREF(lock);
    self->words = PyObject_GetAttrString(block, "words");
    if (!self->acquire || !self->release || !self->words) return -1;
    self->ahead = PyObject_GetAttrString(block, "ahead");
    if (!self->ahead) return -1;
    self->pending = PyObject_GetAttrString(self->ahead, "pending");
    self->drains = PyObject_GetAttrString(self->ahead, "drains");
    if (!self->pending || !self->drains) return -1;
    self->raw = PyObject_GetAttrString(record, "raw");
    self->sig = PyObject_GetAttrString(record, "sig");
    self->digest = PyObject_GetAttrString(record, "digest");
    if (!self->ahead || !self->raw || !self->sig || !self->digest) return -1;
    self->dig = PyLong_AsLongLong(self->digest);
    if (self->dig == -1 && PyErr_Occurred()) return -1;
#define KEEP(f, v) do { Py_INCREF(v); self->f = v; } while (0)
    KEEP(block, block); KEEP(record, record); KEEP(peers, peers); KEEP(sync_hook, sync_hook);
    KEEP(caller, caller); KEEP(tensors, tensors); KEEP(storages, storages); KEEP(slots, slots);
    KEEP(take, take); KEEP(reuse, reuse); KEEP(use_storage, use_storage); KEEP(launch, launch);
    KEEP(before, before); KEEP(middle, middle); KEEP(after, after); KEEP(ints, ints);
    KEEP(raw_stream, raw_stream); KEEP(capturing, capturing); KEEP(hooked, hooked);
    KEEP(tracing, tracing); KEEP(profiling, profiling); KEEP(launches, launches);
    KEEP(book, book);
    KEEP(note_tail, note_tail);
#undef KEEP
    self->device = device;
    self->x_aligned = x_aligned;
    return 0;
}

/* -1 error, 0 false, 1 true */
static int truth_of_call(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (!r) return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

static int attr_is_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int attr_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_attr_ll(PyObject *o, PyObject *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (!v) return -1;
    int r = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return r;
}

/* torch.Tensor and its descriptors (use_tensor_type): a tensor of exactly that type is
 * asked through them, without looking the name up on every call */
static PyTypeObject *tensor_type;
static PyObject *d_data_ptr, *d_use_count, *d_get_device, *d_is_contiguous;  /* methods */
static PyObject *d_shape, *d_dtype, *d_requires_grad;                      /* attributes */

static PyObject *t_call(PyObject *o, PyObject *descr, PyObject *name) {
    if (descr && Py_TYPE(o) == tensor_type) return PyObject_CallOneArg(descr, o);
    return PyObject_CallMethodNoArgs(o, name);
}

static PyObject *t_get(PyObject *o, PyObject *descr, PyObject *name) {
    if (descr && Py_TYPE(o) == tensor_type)
        return Py_TYPE(descr)->tp_descr_get(descr, o, (PyObject *)tensor_type);
    return PyObject_GetAttr(o, name);
}

#define T_CALL(o, m) t_call((o), d_##m, s_##m)
#define T_GET(o, a) t_get((o), d_##a, s_##a)

static long long ll_of(PyObject *v) {
    if (!v) return -1;
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

#define TENSOR_LL(o, m) ll_of(T_CALL(o, m))

/* (file, line) of the frame that called the Python function calling us: the user's
 * call site, as _publish's wrapper records it for a run-ahead check's message. The last
 * (code, instruction) and its tuple are kept: a call repeated from the same line costs no
 * line-table lookup and no new tuple. */
static PyObject *call_site(Entry *self) {
    PyFrameObject *f = PyEval_GetFrame();  /* borrowed: the public function's frame */
    if (!f) Py_RETURN_NONE;
    PyFrameObject *back = PyFrame_GetBack(f);  /* new reference */
    if (!back) Py_RETURN_NONE;
    PyCodeObject *code = PyFrame_GetCode(back);  /* new reference */
#if PY_VERSION_HEX >= 0x030B0000
    int lasti = PyFrame_GetLasti(back);
    if ((PyObject *)code == self->site_code && lasti == self->site_lasti && self->site) {
        Py_DECREF(code);
        Py_DECREF(back);
        Py_INCREF(self->site);
        return self->site;
    }
#else
    int lasti = -1;
#endif
    int line = PyFrame_GetLineNumber(back);
    PyObject *site = Py_BuildValue("(Oi)", code->co_filename, line);
    if (site && lasti >= 0) {
        Py_XSETREF(self->site_code, (PyObject *)code);  /* takes the reference */
        code = NULL;
        self->site_lasti = lasti;
        Py_INCREF(site);
        Py_XSETREF(self->site, site);
    }
    Py_XDECREF(code);
    Py_DECREF(back);
    return site;
}

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* The agreement's run-ahead publish. 1: published call n; 0: not the steady state
 * (nothing changed that the Python path would not change alike); -1: error. */
static int agree_ahead(Entry *self) {
    PyObject *pending = self->pending, *drains = self->drains, *words = self->words;
    PyObject *mine = NULL;
    Py_buffer view = {0};
    int result = 0, held = 0;
    long long seq;

    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);
    if (!got) return -1;
    held = (got == Py_True);
    Py_DECREF(got);
    if (!held) return 0;  /* another thread is inside: the Python path refuses it */

    if (PyList_GET_SIZE(self->sync_hook) < 1 || PyList_GET_ITEM(self->sync_hook, 0) != Py_None)
        goto done;  /* racecheck watches: every call waits */
    int en = attr_is_true(self->ahead, s_enabled);
    if (en <= 0) { result = en; goto done; }
    PyObject *last = PyObject_GetAttr(self->ahead, s_last);
    if (!last) { result = -1; goto done; }
    int same = last == self->raw;
    if (!same && PyBytes_Check(last)) {
        same = PyObject_RichCompareBool(last, self->raw, Py_EQ);
        if (same < 0) { Py_DECREF(last); result = -1; goto done; }
    }
    Py_DECREF(last);
    if (!same) goto done;
    if (attr_ll(self->block, s_seq, &seq) < 0) { result = -1; goto done; }
    long long n = seq + 1;
    mine = PyObject_GetAttr(self->block, s_mine);
    if (!mine) { result = -1; goto done; }
    Py_ssize_t npending = PyObject_Length(pending);
    if (npending < 0) { result = -1; goto done; }
    if (npending >= self->ring) goto done;
    int known = PyDict_Check(drains) ? PyDict_Contains(drains, self->raw) : 0;
    if (known <= 0) { result = known; goto done; }
    if (PyObject_GetBuffer(words, &view, PyBUF_SIMPLE) < 0) { result = -1; goto done; }
    int64_t *w = (int64_t *)view.buf;
    Py_ssize_t nwords = view.len / 8;
    Py_ssize_t npeers = PyTuple_GET_SIZE(self->peers);
    long long stride = self->ring * self->slot_words;
    /* ring_free(n): every peer has checked up to n - RING */
    for (Py_ssize_t i = 0; i < npeers; i++) {
        long long r = PyLong_AsLongLong(PyTuple_GET_ITEM(self->peers, i));
        long long idx = self->state_base + r * self->state_words;
        if (idx < 0 || idx >= nwords) goto done;
        if (LOAD(&w[idx]) < n - self->ring) goto done;
    }
    /* from here on the call runs ahead (the Python path would do the same) */
    long long entered;
    if (attr_ll(self->block, s_entered, &entered) < 0
        || set_attr_ll(self->block, s_entered, entered + 1) < 0) { result = -1; goto done; }
    /* the pending calls every peer has published, checked by digest */
    while (npending > 0) {
        PyObject *head = PySequence_GetItem(pending, 0);
        if (!head) { result = -1; goto done; }
        long long m = PyLong_AsLongLong(PyTuple_GetItem(head, 0));
        long long dig = PyLong_AsLongLong(PyTuple_GetItem(head, 4));
        Py_DECREF(head);
        if (PyErr_Occurred()) { result = -1; goto done; }
        long long slot = (m % self->ring) * self->slot_words;
        int ready = 1, differs = 0;
        for (Py_ssize_t i = 0; i < npeers; i++) {
            long long r = PyLong_AsLongLong(PyTuple_GET_ITEM(self->peers, i));
            long long base = r * stride + slot;
            if (base + 2 >= nwords) { ready = 0; break; }
            if (LOAD(&w[base]) < m) { ready = 0; break; }
        }
        if (!ready) break;
        for (Py_ssize_t i = 0; i < npeers; i++) {
            long long r = PyLong_AsLongLong(PyTuple_GET_ITEM(self->peers, i));
            if (LOAD(&w[r * stride + slot + 2]) != dig) { differs = 1; break; }
        }
        if (differs) {
            /* the Python path checks it in full and raises the mismatch every rank
             * raises: undo our entered count and hand over */
            set_attr_ll(self->block, s_entered, entered);
            goto done;
        }
        PyObject *popped = PyObject_CallMethodNoArgs(pending, s_popleft);
        if (!popped) { result = -1; goto done; }
        Py_DECREF(popped);
        npending--;
        STORE(&w[self->checked_word], m);
    }
    /* publish n: the body is in our slot when it holds this record already */
    long long k = n % self->ring;
    PyObject *held_rec = PyList_Check(mine) && k < PyList_GET_SIZE(mine)
        ? PyList_GET_ITEM(mine, k) : NULL;
    if (held_rec != self->record) {
        PyBuffer_Release(&view);
        PyObject *r = PyObject_CallMethod(self->block, "publish_record", "LO", n, self->record);
        if (!r) { result = -1; goto done; }
        Py_DECREF(r);
    } else {
        long long off = (self->rank * self->ring + k) * self->slot_words;
        if (off >= nwords) { result = -1; PyErr_SetString(PyExc_IndexError, "slot"); goto done; }
        STORE(&w[off], n);
        if (set_attr_ll(self->block, s_last_published, n) < 0) { result = -1; goto done; }
    }
    if (set_attr_ll(self->block, s_seq, n) < 0) { result = -1; goto done; }
    PyObject *site = PyList_GET_SIZE(self->caller) > 0 ? PyList_GET_ITEM(self->caller, 0) : Py_None;
    PyObject *num = PyLong_FromLongLong(n);
    if (!num) { result = -1; goto done; }
    PyObject *item = PyTuple_Pack(5, num, self->sig, self->raw, site, self->digest);
    Py_DECREF(num);
    if (!item) { result = -1; goto done; }
    PyObject *r = PyObject_CallMethodOneArg(pending, s_append, item);
    Py_DECREF(item);
    if (!r) { result = -1; goto done; }
    Py_DECREF(r);
    result = 1;
done:
    if (view.obj) PyBuffer_Release(&view);
    if (result < 0) {  /* as Ahead.repeat: an exception clears the previous call */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject_SetAttr(self->ahead, s_last, Py_None);
        PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(mine);
    PyObject *rel = PyObject_CallNoArgs(self->release);
    if (!rel) return -1;
    Py_DECREF(rel);
    return result;
}

/* An output only the plan holds, on the same stream, its address unchanged: a new
 * reference, or NULL without an error (make one through Outputs.take). */
static PyObject *reusable(Entry *self, long long stream) {
    Py_ssize_t n = PyList_GET_SIZE(self->tensors);
    if (PyList_GET_SIZE(self->storages) != n || PyList_GET_SIZE(self->slots) != n) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(self->tensors, i);
        if (Py_REFCNT(t) != self->free_refs
            || Py_REFCNT(PyList_GET_ITEM(self->storages, i)) != self->free_storage_refs)
            continue;
        PyObject *slot = PyList_GET_ITEM(self->slots, i);
        if (!PyTuple_Check(slot) || PyTuple_GET_SIZE(slot) != 3) continue;
        if (PyLong_AsLongLong(PyTuple_GET_ITEM(slot, 2)) != stream) continue;
        PyObject *u = PyObject_CallOneArg(self->use_storage, PyTuple_GET_ITEM(slot, 0));
        if (!u) { PyErr_Clear(); continue; }
        long long uses = PyLong_AsLongLong(u);
        Py_DECREF(u);
        if (uses != 2) continue;
        if (TENSOR_LL(t, use_count) != 1) { PyErr_Clear(); continue; }
        long long ptr = TENSOR_LL(t, data_ptr);
        if (PyErr_Occurred()) { PyErr_Clear(); continue; }
        if (ptr != PyLong_AsLongLong(PyTuple_GET_ITEM(slot, 1))) continue;
        PyObject *g = T_GET(t, requires_grad);
        if (!g) { PyErr_Clear(); continue; }
        Py_DECREF(g);
        if (g != Py_False) continue;
        Py_INCREF(t);
        return t;
    }
    return NULL;
}

/* whether a CUDA graph captures `stream`: the driver's answer when set_raw gave its entry
 * point (a fraction of torch's query), else torch's; -1 error */
static int capturing(Entry *self, long long stream) {
    int status = 0;
    if (self->raw_capturing && self->raw_capturing((void *)(intptr_t)stream, &status) == 0)
        return status != 0;  /* CU_STREAM_CAPTURE_STATUS_NONE is 0 */
    return truth_of_call(self->capturing);
}

/* whether this thread has a CUDA context to launch in (else Triton's launcher makes one) */
static int raw_ready(Entry *self) {
    void *ctx = NULL;
    return self->raw_ctx(&ctx) == 0 && ctx != NULL;
}

/* the plan's kernel on (x, out) through cuLaunchKernel; the GIL is released around it,
 * as Triton's launcher does (a full launch queue blocks in the driver) */
static PyObject *raw_fire(Entry *self, long long stream, long long xp, long long op) {
    uint64_t values[RAW_MAX];
    void *params[RAW_MAX];
    memcpy(values, self->raw_values, sizeof(uint64_t) * (size_t)self->raw_n);
    values[0] = (uint64_t)xp;
    values[1] = (uint64_t)op;
    for (int i = 0; i < self->raw_n; i++) params[i] = &values[i];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = self->raw_launch(self->raw_function, self->raw_grid[0], self->raw_grid[1],
                          self->raw_grid[2], self->raw_block, 1, 1, self->raw_shared,
                          (void *)(intptr_t)stream, params, NULL);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        const char *text = NULL;
        if (self->raw_error) self->raw_error(rc, &text);
        return PyErr_Format(PyExc_RuntimeError, "commlab: cuLaunchKernel failed: %s (CUDA error %d)",
                            text ? text : "unknown error", rc);
    }
    self->raw_launches++;
    Py_RETURN_NONE;
}

/* site_from_frame: called by the public function itself (the user's line is one frame up);
 * budgeted: an online pick's call form (a CUDA-graph capture freezes the choice in Python) */
static PyObject *entry_run(Entry *self, PyObject *x, PyObject *out, int site_from_frame,
                           int budgeted) {
    if (!self->block) {
        PyErr_SetString(PyExc_RuntimeError, "Entry: not initialized");
        return NULL;
    }
    if (self->retired) Py_RETURN_NONE;
    if (self->device >= 0) {  /* GPU: the ordinary path while anyone watches launches */
        int t = attr_is_true(self->tracing, s_active);  /* trace.needed(), inlined */
        if (t == 0) t = truth_of_call(self->profiling);
        if (t != 0) { if (t < 0) return NULL; Py_RETURN_NONE; }
        t = truth_of_call(self->hooked);
        if (t != 0) { if (t < 0) return NULL; Py_RETURN_NONE; }
    }
    long long stream = 0;  /* the raw current stream (GPU): read first, it changes nothing */
    if (self->device >= 0) {
        PyObject *dev = PyLong_FromLong(self->device);
        if (!dev) return NULL;
        PyObject *s = PyObject_CallOneArg(self->raw_stream, dev);
        Py_DECREF(dev);
        if (!s) return NULL;
        stream = PyLong_AsLongLong(s);
        Py_DECREF(s);
        if (stream == -1 && PyErr_Occurred()) return NULL;
    }
    int capture = -2;  /* whether a CUDA graph captures this stream: asked once, when needed */
    if ((self->capture_choice || budgeted) && self->device >= 0) {
        capture = capturing(self, stream);
        if (capture != 0) { if (capture < 0) return NULL; Py_RETURN_NONE; }
    }
    long long xp = TENSOR_LL(x, data_ptr);
    if (xp == -1 && PyErr_Occurred()) return NULL;
    long long op_ptr = 0;
    if (out != Py_None) {
        op_ptr = TENSOR_LL(out, data_ptr);
        if (op_ptr == -1 && PyErr_Occurred()) return NULL;
    }
    if (self->device >= 0 && ((self->x_aligned && xp % 16) || (out != Py_None && op_ptr % 16)))
        Py_RETURN_NONE;  /* not the alignment the kernel was built for */
    if (site_from_frame) {  /* called by the public function itself: the user's line */
        PyObject *site = call_site(self);
        if (!site) return NULL;
        if (PyList_GET_SIZE(self->caller) > 0) PyList_SetItem(self->caller, 0, site);
        else Py_DECREF(site);
    }
    int ran = agree_ahead(self);
    if (ran <= 0) { if (ran < 0) return NULL; Py_RETURN_NONE; }
    /* committed: this call is published and must launch (an error now is the caller's) */
    if (out == Py_None) {
        if (self->device < 0) capture = 0;
        else if (capture == -2) {
            capture = capturing(self, stream);
            if (capture < 0) return NULL;
        }
        int reuse = PyList_GET_SIZE(self->reuse) > 0 && PyObject_IsTrue(PyList_GET_ITEM(self->reuse, 0)) == 1;
        out = (!capture && reuse) ? reusable(self, stream) : NULL;
        if (!out) {
            out = PyObject_CallFunction(self->take, "OLO", x, stream, capture ? Py_True : Py_False);
            if (!out) return NULL;
        }
        op_ptr = TENSOR_LL(out, data_ptr);
        if (op_ptr == -1 && PyErr_Occurred()) { Py_DECREF(out); return NULL; }
    } else {
        Py_INCREF(out);
    }
    PyObject *r;
    if (self->device < 0) {  /* CPU backend: the plan's host launch, traced */
        r = PyObject_CallFunctionObjArgs(self->launch, x, out, NULL);
    } else if (op_ptr % 16) {  /* a fresh output off the kernel's alignment: never on CUDA */
        PyErr_SetString(PyExc_RuntimeError, "commlab: an output off 16-byte alignment");
        r = NULL;
    } else if (self->raw_n && raw_ready(self)) {  /* one driver call, no argument parsing */
        r = raw_fire(self, stream, xp, op_ptr);
    } else {
        Py_ssize_t nb = PyTuple_GET_SIZE(self->before), nm = PyTuple_GET_SIZE(self->middle);
        Py_ssize_t ni = PyTuple_GET_SIZE(self->ints), na = PyTuple_GET_SIZE(self->after);
        PyObject *a = PyTuple_New(nb + 1 + nm + 2 + ni + na);
        if (!a) { Py_DECREF(out); return NULL; }
        Py_ssize_t j = 0;
        for (Py_ssize_t i = 0; i < nb; i++, j++) {
            PyObject *v = PyTuple_GET_ITEM(self->before, i); Py_INCREF(v); PyTuple_SET_ITEM(a, j, v);
        }
        PyTuple_SET_ITEM(a, j++, PyLong_FromLongLong(stream));
        for (Py_ssize_t i = 0; i < nm; i++, j++) {
            PyObject *v = PyTuple_GET_ITEM(self->middle, i); Py_INCREF(v); PyTuple_SET_ITEM(a, j, v);
        }
        PyTuple_SET_ITEM(a, j++, PyLong_FromLongLong(xp));
        PyTuple_SET_ITEM(a, j++, PyLong_FromLongLong(op_ptr));
        for (Py_ssize_t i = 0; i < ni; i++, j++) {
            PyObject *v = PyTuple_GET_ITEM(self->ints, i); Py_INCREF(v); PyTuple_SET_ITEM(a, j, v);
        }
        for (Py_ssize_t i = 0; i < na; i++, j++) {
            PyObject *v = PyTuple_GET_ITEM(self->after, i); Py_INCREF(v); PyTuple_SET_ITEM(a, j, v);
        }
        r = PyObject_Call(self->launch, a, NULL);
        Py_DECREF(a);
    }
    if (!r) { Py_DECREF(out); return NULL; }
    Py_DECREF(r);
    if (self->device >= 0) {  /* the kernel opens one call record (records.LAUNCHES) */
        PyObject *c = PyList_GET_SIZE(self->launches) > 0 ? PyList_GET_ITEM(self->launches, 0) : NULL;
        long long k1 = c ? PyLong_AsLongLong(c) + 1 : 1;
        PyObject *v = PyLong_FromLongLong(k1);
        if (!v || PyList_SetItem(self->launches, 0, v) < 0) { Py_DECREF(out); return NULL; }
        if (self->book != Py_None) {
            long long base;
            if (attr_ll(self->book, s_base, &base) < 0) { Py_DECREF(out); return NULL; }
            k1 -= base;
            PyObject *nargs = PyTuple_New(2 + PyTuple_GET_SIZE(self->note_tail));
            if (!nargs) { Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(nargs, 0, PyLong_FromLongLong(k1 - 1));
            PyTuple_SET_ITEM(nargs, 1, PyLong_FromLongLong(k1));
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->note_tail); i++) {
                PyObject *t = PyTuple_GET_ITEM(self->note_tail, i);
                Py_INCREF(t);
                PyTuple_SET_ITEM(nargs, 2 + i, t);
            }
            PyObject *note = PyObject_GetAttr(self->book, s_note);
            PyObject *nr = note ? PyObject_Call(note, nargs, NULL) : NULL;
            Py_XDECREF(note);
            Py_DECREF(nargs);
            if (!nr) { Py_DECREF(out); return NULL; }
            Py_DECREF(nr);
        }
    }
    self->hits++;
    return out;
}

static PyObject *entry_call(Entry *self, PyObject *args, PyObject *kw) {
    PyObject *x, *out = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &x, &out)) return NULL;
    return entry_run(self, x, out, 0, 0);
}

static PyObject *entry_retire(Entry *self, PyObject *unused) {
    self->retired = 1;
    Py_RETURN_NONE;
}

static PyObject *entry_set_capture_choice(Entry *self, PyObject *flag) {
    self->capture_choice = PyObject_IsTrue(flag) == 1;
    Py_RETURN_NONE;
}

/* set_raw(function, (gx, gy, gz), block, shared, values, (launch, ctx, error, capturing),
 *         owner):
 * launch through cuLaunchKernel from now on. values: every kernel parameter as a
 * 64-bit little-endian pattern, (x, out) first (their values are the call's). */
static PyObject *entry_set_raw(Entry *self, PyObject *args) {
    unsigned long long function, launch, ctx, error, capt;
    unsigned gx, gy, gz, block, shared;
    PyObject *values, *owner;
    if (!self->block) {
        PyErr_SetString(PyExc_RuntimeError, "Entry: not initialized");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "K(III)IIO!(KKKK)O", &function, &gx, &gy, &gz, &block, &shared,
                          &PyTuple_Type, &values, &launch, &ctx, &error, &capt, &owner))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (n < 2 || n > RAW_MAX || !function || !launch || !ctx || !gx || !gy || !gz || !block) {
        PyErr_Format(PyExc_ValueError, "Entry.set_raw: 2 to %d parameters, a function, the "
                     "driver's launch and context entry points and a non-empty grid are "
                     "needed (got %zd parameters)", RAW_MAX, n);
        return NULL;
    }
    uint64_t vals[RAW_MAX];
    for (Py_ssize_t i = 0; i < n; i++) {
        vals[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(values, i));
        if (vals[i] == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    memcpy(self->raw_values, vals, sizeof(uint64_t) * (size_t)n);
    self->raw_grid[0] = gx; self->raw_grid[1] = gy; self->raw_grid[2] = gz;
    self->raw_block = block;
    self->raw_shared = shared;
    self->raw_function = (void *)(uintptr_t)function;
    self->raw_launch = (cu_launch_t)(uintptr_t)launch;
    self->raw_ctx = (cu_ctx_t)(uintptr_t)ctx;
    self->raw_error = (cu_error_t)(uintptr_t)error;
    self->raw_capturing = (cu_capturing_t)(uintptr_t)capt;
    Py_INCREF(owner);
    Py_XSETREF(self->raw_owner, owner);
    self->raw_n = (int)n;
    Py_RETURN_NONE;
}

static PyMethodDef entry_methods[] = {
    {"set_raw", (PyCFunction)entry_set_raw, METH_VARARGS,
     "launch through cuLaunchKernel with this parameter block from now on"},
    {"retire", (PyCFunction)entry_retire, METH_NOARGS, "never serve a call again"},
    {"set_capture_choice", (PyCFunction)entry_set_capture_choice, METH_O,
     "whether a call inside a CUDA-graph capture must choose afresh (hand it back)"},
    {NULL}
};

static PyObject *entry_get_hits(Entry *self, void *closure) {
    return PyLong_FromLongLong(self->hits);
}

static PyObject *entry_get_raw_launches(Entry *self, void *closure) {
    if (self->raw_n) return PyLong_FromLongLong(self->raw_launches);
    Py_RETURN_NONE;
}

static PyGetSetDef entry_getset[] = {
    {"hits", (getter)entry_get_hits, NULL, "calls this entry served", NULL},
    {"raw_launches", (getter)entry_get_raw_launches, NULL,
     "launches made through cuLaunchKernel, None without set_raw", NULL},
    {NULL}
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commlab._fastcall.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A launch plan's repeated call: Entry(...)(x, out=None) -> output or None.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)entry_init,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_call = (ternaryfunc)entry_call,
    .tp_getset = entry_getset,
    .tp_methods = entry_methods,
};

/* ---- Budget: calls a Dispatch may serve for online selection ---------------------- */

typedef struct {
    PyObject_HEAD
    long long left;    /* calls the Dispatch may still serve (Python grants them) */
    long long used;    /* calls it served since Python last read this */
} Budget;

static PyMemberDef budget_members[] = {
    {"left", T_LONGLONG, offsetof(Budget, left), 0, "calls the Dispatch may still serve"},
    {"used", T_LONGLONG, offsetof(Budget, used), 0, "calls it served since Python took them"},
    {NULL}
};

/* take(): the calls served since the last take, and no more served until a new grant */
static PyObject *budget_take(Budget *self, PyObject *unused) {
    long long used = self->used;
    self->used = 0;
    self->left = 0;
    return PyLong_FromLongLong(used);
}

static PyMethodDef budget_methods[] = {
    {"take", (PyCFunction)budget_take, METH_NOARGS,
     "the calls served since the last take (left becomes 0)"},
    {NULL}
};

static PyTypeObject BudgetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commlab._fastcall.Budget",
    .tp_basicsize = sizeof(Budget),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Calls of one online-selection key a Dispatch may serve (left) and served (used).",
    .tp_new = PyType_GenericNew,
    .tp_members = budget_members,
    .tp_methods = budget_methods,
};

/* ---- Dispatch: a public collective's repeated call form -> its Entry ------------- */

#define NSLOTS 8

typedef struct {
    PyObject *rest;    /* args[1:] (tuple) */
    PyObject *kwargs;  /* dict or NULL */
    PyObject *shape;   /* x.shape */
    PyObject *dtype;   /* x.dtype */
    long long device;  /* x.get_device() */
    Entry *entry;
    Budget *budget;    /* an online pick's call form: serve only while budget->left > 0 */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot slots[NSLOTS];
    int next;          /* the slot the next remember() overwrites */
    int out;           /* where the output is: -1 made by the plan, k: args[k] (0: x) */
} Dispatch;

static void slot_clear(Slot *s) {
    Py_CLEAR(s->rest); Py_CLEAR(s->kwargs); Py_CLEAR(s->shape); Py_CLEAR(s->dtype);
    Py_CLEAR(s->entry); Py_CLEAR(s->budget);
}

static int dispatch_traverse(Dispatch *self, visitproc visit, void *arg) {
    for (int i = 0; i < NSLOTS; i++) {
        Py_VISIT(self->slots[i].rest); Py_VISIT(self->slots[i].kwargs);
        Py_VISIT(self->slots[i].shape); Py_VISIT(self->slots[i].dtype);
        Py_VISIT((PyObject *)self->slots[i].entry);
        Py_VISIT((PyObject *)self->slots[i].budget);
    }
    return 0;
}

static int dispatch_clear(Dispatch *self) {
    for (int i = 0; i < NSLOTS; i++) slot_clear(&self->slots[i]);
    return 0;
}

static void dispatch_dealloc(Dispatch *self) {
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int same(PyObject *a, PyObject *b) {  /* -1 error */
    if (a == b) return 1;
    if (!a || !b) return 0;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

static int no_kwargs(PyObject *kw) { return kw == NULL || kw == Py_None || PyDict_GET_SIZE(kw) == 0; }

/* (shape, dtype, device) of x and whether it is contiguous; -1 error (cleared by caller) */
static int describe(PyObject *x, PyObject **shape, PyObject **dtype, long long *device) {
    *shape = T_GET(x, shape);
    if (!*shape) return -1;
    *dtype = T_GET(x, dtype);
    if (!*dtype) { Py_CLEAR(*shape); return -1; }
    *device = TENSOR_LL(x, get_device);
    if (*device == -1 && PyErr_Occurred()) { Py_CLEAR(*shape); Py_CLEAR(*dtype); return -1; }
    PyObject *c = T_CALL(x, is_contiguous);
    if (!c) { Py_CLEAR(*shape); Py_CLEAR(*dtype); return -1; }
    int contiguous = c == Py_True;
    Py_DECREF(c);
    return contiguous;
}

/* dispatch(args, kwargs): the output of a repeated call served in C, or None */
static PyObject *dispatch_call(Dispatch *self, PyObject *a, PyObject *kw) {
    PyObject *args, *kwargs;
    if (!PyArg_ParseTuple(a, "O!O", &PyTuple_Type, &args, &kwargs)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n < 1) Py_RETURN_NONE;
    PyObject *x = PyTuple_GET_ITEM(args, 0);
    PyObject *shape = NULL, *dtype = NULL;
    long long device;
    int found = -1;
    for (int i = 0; i < NSLOTS; i++) {
        Slot *sl = &self->slots[i];
        if (!sl->entry) continue;
        if (sl->entry->retired) { slot_clear(sl); continue; }
        if (!shape) {
            int c = describe(x, &shape, &dtype, &device);
            if (c <= 0) { PyErr_Clear(); Py_XDECREF(shape); Py_XDECREF(dtype); Py_RETURN_NONE; }
        }
        if (sl->dtype != dtype || sl->device != device) continue;
        if (PyTuple_GET_SIZE(sl->rest) != n - 1) continue;
        int eq = same(sl->shape, shape);
        for (Py_ssize_t j = 1; eq == 1 && j < n; j++)  /* the output is not part of the key */
            if (j != self->out)
                eq = same(PyTuple_GET_ITEM(sl->rest, j - 1), PyTuple_GET_ITEM(args, j));
        if (eq == 1) {
            if (no_kwargs(kwargs) && sl->kwargs == NULL) eq = 1;
            else if (no_kwargs(kwargs) || sl->kwargs == NULL) eq = 0;
            else eq = same(sl->kwargs, kwargs);
        }
        if (eq < 0) { PyErr_Clear(); continue; }
        if (eq) { found = i; break; }
    }
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    if (found < 0) Py_RETURN_NONE;
    Entry *e = self->slots[found].entry;
    Budget *b = self->slots[found].budget;
    if (b && b->left <= 0) Py_RETURN_NONE;  /* online selection has a call to decide */
    PyObject *out = self->out < 0 ? Py_None : self->out < n ? PyTuple_GET_ITEM(args, self->out) : NULL;
    if (!out) Py_RETURN_NONE;
    Py_INCREF(e);
    Py_XINCREF(b);
    PyObject *r = entry_run(e, x, out, 1, b != NULL);
    if (b && r && r != Py_None) { b->left--; b->used++; }
    Py_DECREF(e);
    Py_XDECREF(b);
    return r;
}

static int plain(PyObject *v) {
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v)
        || PyUnicode_CheckExact(v);
}

/* remember(args, kwargs, entry, budget=None): serve this call form with entry from now on
 * (with a budget: only the calls it grants), in place of what served it before */
static PyObject *dispatch_remember(Dispatch *self, PyObject *a) {
    PyObject *args, *kwargs, *entry, *budget = Py_None;
    if (!PyArg_ParseTuple(a, "O!OO!|O", &PyTuple_Type, &args, &kwargs, &EntryType, &entry,
                          &budget))
        return NULL;
    if (budget != Py_None && !PyObject_TypeCheck(budget, &BudgetType)) {
        PyErr_SetString(PyExc_TypeError, "remember: budget must be a Budget or None");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) < 1) Py_RETURN_NONE;
    /* a key compares plain values only (a tensor's == is elementwise) */
    for (Py_ssize_t j = 1; j < PyTuple_GET_SIZE(args); j++)
        if (j != self->out && !plain(PyTuple_GET_ITEM(args, j))) Py_RETURN_NONE;
    if (!no_kwargs(kwargs)) {
        if (!PyDict_Check(kwargs)) Py_RETURN_NONE;
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwargs, &pos, &k, &v))
            if (!plain(v)) Py_RETURN_NONE;
    }
    PyObject *shape, *dtype;
    long long device;
    int c = describe(PyTuple_GET_ITEM(args, 0), &shape, &dtype, &device);
    if (c <= 0) { PyErr_Clear(); Py_XDECREF(shape); Py_XDECREF(dtype); Py_RETURN_NONE; }
    PyObject *rest = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));
    if (!rest) { Py_DECREF(shape); Py_DECREF(dtype); return NULL; }
    if (self->out > 0 && self->out < PyTuple_GET_SIZE(args)) {  /* not kept: not a key */
        PyObject *fresh = PyTuple_New(PyTuple_GET_SIZE(rest));
        if (!fresh) { Py_DECREF(rest); Py_DECREF(shape); Py_DECREF(dtype); return NULL; }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(rest); j++) {
            PyObject *v = j + 1 == self->out ? Py_None : PyTuple_GET_ITEM(rest, j);
            Py_INCREF(v);
            PyTuple_SET_ITEM(fresh, j, v);
        }
        Py_DECREF(rest);
        rest = fresh;
    }
    PyObject *kwcopy = NULL;
    if (!no_kwargs(kwargs)) {
        kwcopy = PyDict_Copy(kwargs);
        if (!kwcopy) { Py_DECREF(rest); Py_DECREF(shape); Py_DECREF(dtype); return NULL; }
    }
    int i = -1;  /* the slot of this very call form (a new entry replaces the old) */
    for (int j = 0; j < NSLOTS && i < 0; j++) {
        Slot *o = &self->slots[j];
        if (!o->entry || o->dtype != dtype || o->device != device) continue;
        int eq = same(o->shape, shape);
        if (eq == 1) eq = same(o->rest, rest);
        if (eq == 1 && (o->kwargs == NULL) != (kwcopy == NULL)) eq = 0;
        if (eq == 1 && kwcopy) eq = same(o->kwargs, kwcopy);
        if (eq < 0) PyErr_Clear();
        if (eq == 1) i = j;
    }
    if (i < 0) {  /* a free or retired slot first, else round robin */
        i = self->next;
        for (int j = 0; j < NSLOTS; j++)
            if (!self->slots[j].entry || self->slots[j].entry->retired) { i = j; break; }
        if (i == self->next) self->next = (self->next + 1) % NSLOTS;
    }
    Slot *sl = &self->slots[i];
    slot_clear(sl);
    sl->rest = rest; sl->kwargs = kwcopy; sl->shape = shape; sl->dtype = dtype;
    sl->device = device;
    Py_INCREF(entry);
    sl->entry = (Entry *)entry;
    if (budget != Py_None) {
        Py_INCREF(budget);
        sl->budget = (Budget *)budget;
    }
    Py_RETURN_NONE;
}

static int dispatch_init(Dispatch *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"out", NULL};
    PyObject *out = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", names, &out)) return -1;
    self->out = out == Py_None ? -1 : (int)PyLong_AsLong(out);
    if (self->out == -1 && PyErr_Occurred()) return -1;
    return 0;
}

static PyMethodDef dispatch_methods[] = {
    {"remember", (PyCFunction)dispatch_remember, METH_VARARGS,
     "remember(args, kwargs, entry, budget=None): serve this call form with entry"},
    {NULL}
};

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commlab._fastcall.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A public collective's repeated call forms: Dispatch(out=None)(args, kwargs) -> output or None.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dispatch_init,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_traverse = (traverseproc)dispatch_traverse,
    .tp_clear = (inquiry)dispatch_clear,
    .tp_call = (ternaryfunc)dispatch_call,
    .tp_methods = dispatch_methods,
};

/* Py_REFCNT of lst[0]: what an output only the plan's list holds reads as here. */
static PyObject *item_refcount(PyObject *mod, PyObject *lst) {
    if (!PyList_Check(lst) || PyList_GET_SIZE(lst) < 1) {
        PyErr_SetString(PyExc_TypeError, "item_refcount: a non-empty list");
        return NULL;
    }
    return PyLong_FromSsize_t(Py_REFCNT(PyList_GET_ITEM(lst, 0)));
}

/* use_tensor_type(torch.Tensor): ask tensors of exactly this type through its descriptors */
static PyObject *use_tensor_type(PyObject *mod, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "use_tensor_type: a type (torch.Tensor)");
        return NULL;
    }
    PyObject *names[] = {s_data_ptr, s_use_count, s_get_device, s_is_contiguous, s_shape,
                         s_dtype, s_requires_grad};
    PyObject **slots[] = {&d_data_ptr, &d_use_count, &d_get_device, &d_is_contiguous, &d_shape,
                          &d_dtype, &d_requires_grad};
    for (int i = 0; i < 7; i++) {
        PyObject *d = PyObject_GetAttr(type, names[i]);
        if (!d) return NULL;
        PyTypeObject *want = i < 4 ? &PyMethodDescr_Type : &PyGetSetDescr_Type;
        if (Py_TYPE(d) != want) {  /* not the descriptor it must be: ask by name */
            Py_DECREF(d);
            d = NULL;
        }
        Py_XSETREF(*slots[i], d);
    }
    Py_INCREF(type);
    Py_XSETREF(tensor_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

/* records_brief(rings, counts, k_lo, n, ring_len): online selection's read of the call
 * records k_lo .. k_lo+n-1 (runtime/records.py, Book.peek on CPU) where they lie in every
 * rank's shared memory. rings: each rank's ring address ([ring_len][call, entry, arrived,
 * end] int64); counts: each rank's count word's address, read after the slots (a slot
 * rewritten while it was read reads as lost). Returns (status, last entries, last ends):
 * per record 0 waiting (a rank has not finished it), 1 ready, 2 lost (the ring went
 * round), and the latest entry and end over the ranks. */
static PyObject *records_brief(PyObject *unused, PyObject *args) {
    PyObject *rings, *counts;
    long long k_lo, n, ring;
    if (!PyArg_ParseTuple(args, "O!O!LLL", &PyTuple_Type, &rings, &PyTuple_Type, &counts,
                          &k_lo, &n, &ring))
        return NULL;
    Py_ssize_t w = PyTuple_GET_SIZE(rings);
    if (w < 1 || w > 4096 || PyTuple_GET_SIZE(counts) != w || n < 0 || ring < 1 || k_lo < 1) {
        PyErr_SetString(PyExc_ValueError, "records_brief: 1..4096 ranks, as many counts, "
                        "n >= 0, ring >= 1, k_lo >= 1");
        return NULL;
    }
    const volatile int64_t *at[4096];
    for (Py_ssize_t r = 0; r < w; r++) {
        at[r] = (const volatile int64_t *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(rings, r));
        if (!at[r]) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "null ring");
    }
    PyObject *status = PyBytes_FromStringAndSize(NULL, n);
    PyObject *firsts = PyList_New(n), *lasts = PyList_New(n);
    if (!status || !firsts || !lasts) goto fail;
    char *st = PyBytes_AS_STRING(status);
    for (long long i = 0; i < n; i++) {
        long long k = k_lo + i, slot = ((k - 1) % ring) * 4;
        int64_t first = 0, last = 0;
        char s = 1;
        for (Py_ssize_t r = 0; r < w; r++) {
            int64_t call = at[r][slot], entry = at[r][slot + 1], end = at[r][slot + 3];
            if (call > k) s = 2;
            else if ((call != k || end == 0) && s == 1) s = 0;
            if (entry > first) first = entry;
            if (end > last) last = end;
        }
        st[i] = s;
        PyObject *a = PyLong_FromLongLong(first), *b = PyLong_FromLongLong(last);
        if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); goto fail; }
        PyList_SET_ITEM(firsts, i, a);
        PyList_SET_ITEM(lasts, i, b);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    long long count = 0;
    for (Py_ssize_t r = 0; r < w; r++) {
        const volatile int64_t *c = (const volatile int64_t *)PyLong_AsVoidPtr(
            PyTuple_GET_ITEM(counts, r));
        if (!c) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null count"); goto fail; }
        if (*c > count) count = *c;
    }
    for (long long i = 0; i < n && k_lo + i <= count - ring; i++) st[i] = 2;
    return Py_BuildValue("(NNN)", status, firsts, lasts);
fail:
    Py_XDECREF(status); Py_XDECREF(firsts); Py_XDECREF(lasts);
    return NULL;
}

static PyMethodDef methods[] = {
    {"records_brief", records_brief, METH_VARARGS,
     "(status, last entries, last ends) of call records k_lo.. in every rank's ring"},
    {"item_refcount", item_refcount, METH_O, "Py_REFCNT(lst[0])"},
    {"use_tensor_type", use_tensor_type, METH_O,
     "ask tensors of exactly this type (torch.Tensor) through its descriptors"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcall", "A launch plan's repeated call in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
#define INTERN(v, s) if (!(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_seq, "seq"); INTERN(s_enabled, "enabled"); INTERN(s_last, "last");
    INTERN(s_entered, "entered"); INTERN(s_mine, "_mine");
    INTERN(s_last_published, "last_published"); INTERN(s_popleft, "popleft");
    INTERN(s_append, "append"); INTERN(s_data_ptr, "data_ptr");
    INTERN(s_use_count, "_use_count"); INTERN(s_requires_grad, "requires_grad");
    INTERN(s_note, "note"); INTERN(s_base, "_base");
    INTERN(s_shape, "shape"); INTERN(s_dtype, "dtype"); INTERN(s_get_device, "get_device");
    INTERN(s_is_contiguous, "is_contiguous"); INTERN(s_active, "active");
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddType(m, &EntryType) < 0 || PyModule_AddType(m, &DispatchType) < 0
        || PyModule_AddType(m, &BudgetType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
