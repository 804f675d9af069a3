/* Folders' listings with attributes, kept for the readdir gate (folders.c)
 * to answer a folder's READDIRPLUS without a Python callback.
 *
 * listings_put(path, generation, entries): keep the listing of the folder
 * at `path` (bytes, as libfuse names it to readdir), each entry a tuple
 * (name, st, fill): its name (bytes, no NUL), its `struct stat` (bytes,
 * sizeof(struct stat) of them) and the flags to fill it with; kept under
 * `generation`, the count of changes of what the mount remembers
 * (compatfs.fuse.paths.Paths), which must be the current one
 * (listings_generation).  Whether it was kept: not for an older
 * generation, past MOST_LISTINGS folders or MOST_BYTES kept in all.  A newer
 * generation drops every listing kept before.  TypeError or ValueError for
 * entries not laid out so, or more than MOST_ENTRIES of them.
 *
 * listings_generation(generation): the current generation (a listing kept
 * under another is no longer answered from).
 *
 * listings_has(path, generation): whether the folder's listing is kept
 * under that generation.
 *
 * listings_served(): the listings answered from here so far.
 *
 * accel_listing_fill(path, buf, filler, offset, count) (accel.h): whether
 * the folder at `path` is kept under the current generation; if so, its
 * entries from `offset` on filled in as kept (each with its position + 1
 * as the offset to go on from), until the end or until `filler` finds the
 * reply full; `*count` its entries where filled to the end, else 0. */
#include "accel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SLOTS (1u << 17)       /* open addressing, linear probing; never more than half full */
#define MOST_LISTINGS (1u << 16)
#define MOST_BYTES ((size_t)64 << 20)
#define MOST_ENTRIES 256

struct entry {
    const char *name; /* NUL-terminated, inside the listing's block */
    int fill;
};

struct listing {
    size_t size; /* of its block */
    size_t path_len;
    uint32_t count;
    struct entry *entries;
    struct stat *stats;
    char path[]; /* NUL-terminated; then the entries, stats and names */
};

static struct listing *slots[SLOTS];
static unsigned kept_count;
static size_t kept_bytes;
static unsigned long long kept_generation; /* of every listing in slots */
static atomic_ullong current;              /* the generation listings are answered under */
static atomic_ullong served;
static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;

static uint32_t hash(const char *path, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)path[i]) * 16777619u;
    return h;
}

/* The slot of `path`: where it is kept, or the empty one it would go in
 * (under table_lock). */
static unsigned slot_of(const char *path, size_t n)
{
    unsigned at = hash(path, n) & (SLOTS - 1);
    while (slots[at] && !(slots[at]->path_len == n && memcmp(slots[at]->path, path, n) == 0))
        at = (at + 1) & (SLOTS - 1);
    return at;
}

static void drop_all(void)
{
    for (unsigned i = 0; i < SLOTS; i++) {
        free(slots[i]);
        slots[i] = NULL;
    }
    kept_count = 0;
    kept_bytes = 0;
}

/* One block holding the listing of `path` made of `entries` (a list of
 * (name, st, fill)); NULL with an exception set when they are not so. */
static struct listing *packed(const char *path, size_t path_len, PyObject *entries)
{
    Py_ssize_t count = PyList_Size(entries), names = 0;
    if (count < 0)
        return NULL;
    if (count > MOST_ENTRIES) {
        PyErr_SetString(PyExc_ValueError, "listings_put: too many entries");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *e = PyList_GET_ITEM(entries, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(e, 0))
            || !PyBytes_Check(PyTuple_GET_ITEM(e, 1)) || !PyLong_Check(PyTuple_GET_ITEM(e, 2))) {
            PyErr_SetString(PyExc_TypeError, "listings_put: an entry is not (name, st, fill)");
            return NULL;
        }
        PyObject *name = PyTuple_GET_ITEM(e, 0);
        if (PyBytes_GET_SIZE(PyTuple_GET_ITEM(e, 1)) != (Py_ssize_t)sizeof(struct stat)
            || PyBytes_GET_SIZE(name) == 0 || PyBytes_GET_SIZE(name) > 255
            || memchr(PyBytes_AS_STRING(name), 0, (size_t)PyBytes_GET_SIZE(name))) {
            PyErr_SetString(PyExc_ValueError, "listings_put: an entry's name or struct stat is not one");
            return NULL;
        }
        names += PyBytes_GET_SIZE(name) + 1;
    }
    size_t head = (sizeof(struct listing) + path_len + 1 + 15) & ~(size_t)15;
    size_t stats = (head + (size_t)count * sizeof(struct entry) + 15) & ~(size_t)15;
    size_t size = stats + (size_t)count * sizeof(struct stat) + (size_t)names;
    char *block = malloc(size);
    if (!block) {
        PyErr_NoMemory();
        return NULL;
    }
    struct listing *l = (struct listing *)block;
    l->size = size;
    l->path_len = path_len;
    l->count = (uint32_t)count;
    memcpy(l->path, path, path_len);
    l->path[path_len] = 0;
    l->entries = (struct entry *)(block + head);
    l->stats = (struct stat *)(block + stats);
    char *name_at = block + stats + (size_t)count * sizeof(struct stat);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *e = PyList_GET_ITEM(entries, i), *name = PyTuple_GET_ITEM(e, 0);
        size_t n = (size_t)PyBytes_GET_SIZE(name);
        int overflow = 0;
        long fill = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(e, 2), &overflow);
        if (overflow || fill < 0 || fill > INT32_MAX) {
            free(block);
            PyErr_SetString(PyExc_ValueError, "listings_put: an entry's fill flags are not one");
            return NULL;
        }
        memcpy(&l->stats[i], PyBytes_AS_STRING(PyTuple_GET_ITEM(e, 1)), sizeof(struct stat));
        memcpy(name_at, PyBytes_AS_STRING(name), n);
        name_at[n] = 0;
        l->entries[i].name = name_at;
        l->entries[i].fill = (int)fill;
        name_at += n + 1;
    }
    return l;
}

PyObject *accel_listings_put(PyObject *self, PyObject *args)
{
    const char *path;
    Py_ssize_t path_len;
    unsigned long long generation;
    PyObject *entries;
    (void)self;
    if (!PyArg_ParseTuple(args, "y#KO!", &path, &path_len, &generation, &PyList_Type, &entries))
        return NULL;
    if (path_len == 0 || memchr(path, 0, (size_t)path_len)) {
        PyErr_SetString(PyExc_ValueError, "listings_put: no path, or a NUL in it");
        return NULL;
    }
    struct listing *l = packed(path, (size_t)path_len, entries);
    if (!l)
        return NULL;
    int kept = 0;
    pthread_rwlock_wrlock(&table_lock);
    if (generation == atomic_load(&current) && generation >= kept_generation) {
        if (generation != kept_generation) {
            drop_all();
            kept_generation = generation;
        }
        unsigned at = slot_of(path, (size_t)path_len);
        size_t gone = slots[at] ? slots[at]->size : 0;
        if ((slots[at] || kept_count < MOST_LISTINGS) && kept_bytes - gone + l->size <= MOST_BYTES) {
            kept_count += !slots[at];
            kept_bytes = kept_bytes - gone + l->size;
            free(slots[at]);
            slots[at] = l;
            l = NULL;
            kept = 1;
        }
    }
    pthread_rwlock_unlock(&table_lock);
    free(l);
    return PyBool_FromLong(kept);
}

PyObject *accel_listings_generation(PyObject *self, PyObject *args)
{
    unsigned long long generation;
    (void)self;
    if (!PyArg_ParseTuple(args, "K", &generation))
        return NULL;
    atomic_store(&current, generation);
    Py_RETURN_NONE;
}

PyObject *accel_listings_has(PyObject *self, PyObject *args)
{
    const char *path;
    Py_ssize_t path_len;
    unsigned long long generation;
    (void)self;
    if (!PyArg_ParseTuple(args, "y#K", &path, &path_len, &generation))
        return NULL;
    pthread_rwlock_rdlock(&table_lock);
    int has = generation == kept_generation && slots[slot_of(path, (size_t)path_len)] != NULL;
    pthread_rwlock_unlock(&table_lock);
    return PyBool_FromLong(has);
}

PyObject *accel_listings_served(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&served));
}

int accel_listing_fill(const char *path, void *buf, accel_filler filler, int64_t offset, uint32_t *count)
{
    int answered = 0;
    size_t n = strlen(path);
    pthread_rwlock_rdlock(&table_lock);
    struct listing *l = slots[slot_of(path, n)];
    if (l && kept_generation == atomic_load(&current) && offset >= 0) {
        answered = 1;
        *count = l->count;
        for (int64_t i = offset; i < (int64_t)l->count; i++)
            if (filler(buf, l->entries[i].name, &l->stats[i], i + 1, l->entries[i].fill) != 0) {
                *count = 0; /* (the reply is full: the kernel asks again from entry i) */
                break;
            }
    }
    pthread_rwlock_unlock(&table_lock);
    if (answered)
        atomic_fetch_add(&served, 1);
    return answered;
}
