/* What the files of compatfs._accel share: each one's functions the
 * module's method table (module.c) names, whether root's opens of folders
 * are answered in C (folders.c), which polling.c asks, the kept listings
 * the readdir gate answers from (listings.c), the queue of kin pages the
 * read gate makes (stores.c), whether the session goes on (ending.c), and how a gate
 * checks where its fields lie and keeps its settings (folders.c,
 * readgate.c). */
#ifndef COMPATFS_ACCEL_H
#define COMPATFS_ACCEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

PyObject *accel_mxfp4_repack(PyObject *self, PyObject *args);
PyObject *accel_gather_read(PyObject *self, PyObject *args);
PyObject *accel_keep_opendir(PyObject *self, PyObject *args);
PyObject *accel_opendir_gate(PyObject *self, PyObject *args);
PyObject *accel_dir_handle(PyObject *self, PyObject *unused);
PyObject *accel_listed(PyObject *self, PyObject *args);
PyObject *accel_readdir_gate(PyObject *self, PyObject *args);
PyObject *accel_polling_io(PyObject *self, PyObject *args);
PyObject *accel_polled(PyObject *self, PyObject *unused);
PyObject *accel_read_gate(PyObject *self, PyObject *args);
PyObject *accel_read_plan(PyObject *self, PyObject *args);
PyObject *accel_read_forget(PyObject *self, PyObject *args);
PyObject *accel_read_planned(PyObject *self, PyObject *args);
PyObject *accel_read_events(PyObject *self, PyObject *unused);
PyObject *accel_read_generation(PyObject *self, PyObject *unused);
PyObject *accel_read_served(PyObject *self, PyObject *unused);
PyObject *accel_read_stores_wake(PyObject *self, PyObject *args);
PyObject *accel_read_stores(PyObject *self, PyObject *unused);
PyObject *accel_read_store_free(PyObject *self, PyObject *args);
PyObject *accel_read_stores_refused(PyObject *self, PyObject *unused);
PyObject *accel_notices_hold(PyObject *self, PyObject *unused);
PyObject *accel_notices_release(PyObject *self, PyObject *unused);
PyObject *accel_notices_begin(PyObject *self, PyObject *unused);
PyObject *accel_notices_end(PyObject *self, PyObject *unused);
PyObject *accel_listings_put(PyObject *self, PyObject *args);
PyObject *accel_listings_generation(PyObject *self, PyObject *args);
PyObject *accel_listings_has(PyObject *self, PyObject *args);
PyObject *accel_listings_served(PyObject *self, PyObject *unused);

int accel_root_opens_gated(void);

/* Memory for `size` bytes of kin pages, counted against the queue's limit
 * (NULL: over it, no memory, or no pages made); given back, uncounted, with
 * accel_store_give, or handed to the queue with accel_store_queue (stores.c). */
void *accel_store_take(int64_t size);
void accel_store_give(void *mem, int64_t size);
void accel_store_queue(uint64_t fh, int64_t offset, void *mem, int64_t size);

/* The FUSE session ended (ending.c): no path invalidation is sent from now
 * on, once those under way are done. */
void accel_session_ended(void);

/* `count` 17-byte MXFP4 blocks at `in`, in the checkpoint's nibble order,
 * into ggml's at `out` (repack.c). */
void accel_mxfp4_blocks(uint8_t *out, const uint8_t *in, int64_t count);

/* libfuse 3's fuse_fill_dir_t: (buf, name, const struct stat *, off_t, flags). */
typedef int (*accel_filler)(void *buf, const char *name, const void *st, int64_t offset, int flags);
int accel_listing_fill(const char *path, void *buf, accel_filler filler, int64_t offset, uint32_t *count);

/* Whether a `width`-byte field `offset` bytes into a struct of `size`
 * bytes lies in it, aligned to its width. */
static inline int accel_field_in(Py_ssize_t offset, Py_ssize_t size, Py_ssize_t width)
{
    return offset >= 0 && offset <= size - width && offset % width == 0;
}

/* A gate's settings, the process's: `want` (n bytes, zeroed before its
 * fields were set) kept in `kept` the first time (`*taken` then set), and
 * later only the same accepted; 0 with ValueError `why` for others. */
static inline int accel_keep_once(void *kept, const void *want, size_t n, int *taken, const char *why)
{
    if (*taken && memcmp(kept, want, n) != 0) {
        PyErr_SetString(PyExc_ValueError, why);
        return 0;
    }
    memcpy(kept, want, n);
    *taken = 1;
    return 1;
}

#endif
