/* The kin pages the read gate makes (readgate.c): when a read of one op
 * tensor of a span group (the halves of an interleaved stack) reads the
 * input span, the other's same rows are made from it too, as whole pages
 * of the file, and queued here for Python to hand to the kernel's page
 * cache (`fuse.pagecache`), which sends each only while its open file is
 * open and its path serves its view.
 *
 * read_stores_wake(fd, limit): from now on pages are made while at most
 * `limit` bytes of them are queued or being made, and `fd` (an eventfd) is
 * written to when the queue was empty and a store joins it; fd -1: none is
 * made from now on (the fd is never written to again once this returns).
 * The memory of stores given back is kept for the next ones (as much as
 * the limit again, at most), freed once none is made.
 * read_stores(): the stores queued, taken out: (fh, offset, mem, size)
 * each, `size` bytes at address `mem` for the pages of open file fh's view
 * from `offset`; each is given back with read_store_free(mem, size) once
 * sent or dropped.
 * read_stores_refused(): kin ranges not made so far (the queue full). */
#include "accel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define UNIT (256 << 10) /* memory for stores is allocated in multiples of this */
#define SPARES 64

typedef struct store {
    struct store *next;
    uint64_t fh;
    int64_t offset, size;
    void *mem;
} store;

/* Memory of stores sent, kept for the next ones (a reused buffer costs no
 * page faults): its address and the bytes allocated there. */
typedef struct {
    void *mem;
    int64_t room;
} spare;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* all below */
static store *head, **tail = &head;
static int wake_fd = -1;
static int64_t limit, taken; /* bytes allowed, bytes queued or being made */
static spare spares[SPARES];
static int spared;
static int64_t spared_bytes;
static _Atomic uint64_t refused;

/* The bytes allocated for a store of `size` bytes. */
static int64_t room_for(int64_t size)
{
    return (size + UNIT - 1) / UNIT * UNIT;
}

void *accel_store_take(int64_t size)
{
    void *mem = NULL;
    pthread_mutex_lock(&lock);
    int room = wake_fd >= 0 && size > 0 && taken + size <= limit;
    if (room) {
        taken += size;
        for (int i = 0; i < spared; i++)
            if (spares[i].room == room_for(size)) {
                mem = spares[i].mem;
                spared_bytes -= spares[i].room;
                spares[i] = spares[--spared];
                break;
            }
    } else if (wake_fd >= 0)
        atomic_fetch_add(&refused, 1);
    pthread_mutex_unlock(&lock);
    if (room && !mem && posix_memalign(&mem, 4096, (size_t)room_for(size))) {
        accel_store_give(NULL, size);
        mem = NULL;
    }
    return mem;
}

void accel_store_give(void *mem, int64_t size)
{
    pthread_mutex_lock(&lock);
    taken -= size;
    if (mem && spared < SPARES && spared_bytes + room_for(size) <= limit) {
        spares[spared++] = (spare){mem, room_for(size)};
        spared_bytes += room_for(size);
        mem = NULL;
    }
    pthread_mutex_unlock(&lock);
    free(mem);
}

void accel_store_queue(uint64_t fh, int64_t offset, void *mem, int64_t size)
{
    store *s = malloc(sizeof *s);
    if (!s) {
        accel_store_give(mem, size);
        return;
    }
    *s = (store){.fh = fh, .offset = offset, .size = size, .mem = mem};
    pthread_mutex_lock(&lock);
    int was_empty = head == NULL;
    *tail = s;
    tail = &s->next;
    if (was_empty && wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t ignored = write(wake_fd, &one, sizeof one); /* (a full counter wakes the reader all the same) */
        (void)ignored;
    }
    pthread_mutex_unlock(&lock);
}

PyObject *accel_read_stores_wake(PyObject *self, PyObject *args)
{
    int fd;
    long long most;
    (void)self;
    if (!PyArg_ParseTuple(args, "iL", &fd, &most))
        return NULL;
    void *dropped[SPARES];
    int count = 0;
    pthread_mutex_lock(&lock);
    wake_fd = fd < 0 ? -1 : fd;
    limit = most < 0 || fd < 0 ? 0 : most;
    while (fd < 0 && spared) { /* (no spare is kept while none is made) */
        spared--;
        spared_bytes -= spares[spared].room;
        dropped[count++] = spares[spared].mem;
    }
    pthread_mutex_unlock(&lock);
    while (count)
        free(dropped[--count]);
    Py_RETURN_NONE;
}

PyObject *accel_read_stores(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    pthread_mutex_lock(&lock);
    store *s = head;
    head = NULL;
    tail = &head;
    pthread_mutex_unlock(&lock);
    PyObject *out = PyList_New(0);
    while (s) {
        store *next = s->next;
        PyObject *t = out ? Py_BuildValue("(KLKL)", (unsigned long long)s->fh, (long long)s->offset,
                                          (unsigned long long)(uintptr_t)s->mem, (long long)s->size)
                          : NULL;
        if (!t || PyList_Append(out, t)) {
            Py_XDECREF(t);
            accel_store_give(s->mem, s->size); /* (what could not be handed over is dropped) */
        } else
            Py_DECREF(t);
        free(s);
        s = next;
    }
    return out;
}

PyObject *accel_read_store_free(PyObject *self, PyObject *args)
{
    unsigned long long mem;
    long long size;
    (void)self;
    if (!PyArg_ParseTuple(args, "KL", &mem, &size))
        return NULL;
    accel_store_give((void *)(uintptr_t)mem, size);
    Py_RETURN_NONE;
}

PyObject *accel_read_stores_refused(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&refused));
}
