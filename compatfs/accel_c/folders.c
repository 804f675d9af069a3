/* keep_opendir(original, offset, mask): the address of a libfuse 3
 * low-level opendir (`void (*)(fuse_req_t, fuse_ino_t, struct
 * fuse_file_info *)`) that sets the bits `mask` in the 32-bit word `offset`
 * bytes into the request's fuse_file_info (where its keep_cache and
 * cache_readdir bits are) and calls `original`, the session's own: what
 * compatfs.fuse.libfuse installs in place of the session's opendir on a
 * libfuse that drops what the high-level opendir sets, without a Python
 * callback per folder opened.  One original per process (a libfuse's is
 * the same for every session); ValueError for another.
 *
 * opendir_gate(fallback, context, uid_offset, fh_offset, offset, mask): the
 * address of a libfuse 3 high-level opendir (`int (*)(const char *path,
 * struct fuse_file_info *fi)`) that answers an open of a folder by root
 * (uid 0 in the `struct fuse_context` that `context`, libfuse's
 * fuse_get_context, returns: the 32-bit uid `uid_offset` bytes in) as
 * compatfs.fuse.operations.CompatFS.opendir does, with nothing to look up
 * (fh a `dir_handle`, the bits `mask` set in the 32-bit word `offset`
 * bytes into the fuse_file_info, 0 returned) and passes every other open to
 * `fallback`, the Python one, whose answer it returns: what
 * compatfs.fuse.libfuse installs as the high-level opendir, without a
 * Python callback per folder root opens.  One gate per process; ValueError
 * for another.
 *
 * dir_handle(): a folder's fh that no other open of a folder in this
 * process has (a counter from 1), for the opens opendir_gate passes on.
 *
 * readdir_gate(fallback, fh_offset, stat_size, plus): the address of a
 * libfuse 3 high-level readdir (`int (*)(const char *path, void *buf,
 * fuse_fill_dir_t filler, off_t offset, struct fuse_file_info *fi, enum
 * fuse_readdir_flags)`) that answers without a Python callback:
 * - a request from an offset at or past the end of a folder listed to its
 *   end (`listed(fh, count)`, the fh the 64-bit word `fh_offset` bytes into
 *   the fuse_file_info) with nothing filled: the empty reply that ends the
 *   listing, which a caller's last getdents asks for after every folder;
 * - a request with attributes (the flag `plus` set) for a folder whose
 *   listing is kept (listings.c) from what is kept, noting the folder
 *   listed when filled to its end.
 * Every other request goes to `fallback`, the Python one.  A folder's count
 * sits in one of 4096 slots by its fh (never reused): one listed later in
 * the same slot only sends the request to `fallback`.  ValueError where
 * `stat_size` is not this libc's struct stat's.  One gate per process;
 * ValueError for another. */
#include "accel.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>

typedef void (*lowlevel_opendir)(void *req, uint64_t ino, void *fi);

struct keep_settings {
    lowlevel_opendir original;
    Py_ssize_t offset;
    uint32_t mask;
};
static struct keep_settings kept;
static int kept_taken;

/* Set the bits `mask` in the 32-bit word `offset` bytes into `fi`. */
static void set_bits(void *fi, Py_ssize_t offset, uint32_t mask)
{
    uint32_t word;
    memcpy(&word, (char *)fi + offset, sizeof word);
    word |= mask;
    memcpy((char *)fi + offset, &word, sizeof word);
}

static void opendir_keeping(void *req, uint64_t ino, void *fi)
{
    set_bits(fi, kept.offset, kept.mask);
    kept.original(req, ino, fi);
}

PyObject *accel_keep_opendir(PyObject *self, PyObject *args)
{
    unsigned long long original;
    Py_ssize_t offset;
    unsigned long mask;
    (void)self;
    if (!PyArg_ParseTuple(args, "Knk", &original, &offset, &mask))
        return NULL;
    if (!original || !accel_field_in(offset, 64, sizeof(uint32_t)) || !mask || mask > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "keep_opendir: no original, or bits outside fuse_file_info's words");
        return NULL;
    }
    struct keep_settings want;
    memset(&want, 0, sizeof want);
    want.original = (lowlevel_opendir)(uintptr_t)original;
    want.offset = offset;
    want.mask = (uint32_t)mask;
    if (!accel_keep_once(&kept, &want, sizeof want, &kept_taken, "keep_opendir: already wraps another opendir"))
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)opendir_keeping);
}

typedef int (*highlevel_opendir)(const char *path, void *fi);
typedef void *(*context_getter)(void);

static atomic_ullong dir_handles = 1; /* the fh of the next folder opened (0: none) */
struct opendir_settings {
    highlevel_opendir fallback;
    context_getter context;
    Py_ssize_t uid_offset, fh_offset, offset;
    uint32_t mask;
};
static struct opendir_settings gate;
static int gate_taken;

static int opendir_gated(const char *path, void *fi)
{
    const char *ctx = gate.context();
    uint32_t uid;
    if (!ctx)
        return gate.fallback(path, fi);
    memcpy(&uid, ctx + gate.uid_offset, sizeof uid);
    if (uid != 0)
        return gate.fallback(path, fi);
    uint64_t fh = atomic_fetch_add(&dir_handles, 1);
    memcpy((char *)fi + gate.fh_offset, &fh, sizeof fh);
    set_bits(fi, gate.offset, gate.mask);
    return 0;
}

PyObject *accel_dir_handle(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_fetch_add(&dir_handles, 1));
}

/* Folders listed to their end: slot fh % LISTED_SLOTS holds fh and the
 * entry count, one 64-bit word (fh above LISTED_COUNT_BITS bits of count). */
#define LISTED_SLOTS 4096
#define LISTED_COUNT_BITS 20
static _Atomic uint64_t listed_slots[LISTED_SLOTS];

typedef int (*highlevel_readdir)(const char *path, void *buf, void *filler, int64_t offset, void *fi, int flags);
struct readdir_settings {
    highlevel_readdir fallback;
    Py_ssize_t fh_offset;
    int plus;
};
static struct readdir_settings listing;
static int listing_taken;

/* Note the folder open as `fh` listed to its end, `count` entries. */
static void mark_listed(uint64_t fh, uint64_t count)
{
    if (fh && fh < (1ULL << (64 - LISTED_COUNT_BITS)) && count < (1u << LISTED_COUNT_BITS))
        atomic_store(&listed_slots[fh % LISTED_SLOTS], fh << LISTED_COUNT_BITS | count);
}

static int readdir_gated(const char *path, void *buf, void *filler, int64_t offset, void *fi, int flags)
{
    uint64_t fh;
    uint32_t count;
    memcpy(&fh, (char *)fi + listing.fh_offset, sizeof fh);
    if (offset > 0) {
        uint64_t slot = atomic_load(&listed_slots[fh % LISTED_SLOTS]);
        if (fh && slot >> LISTED_COUNT_BITS == fh
            && (uint64_t)offset >= (slot & ((1u << LISTED_COUNT_BITS) - 1)))
            return 0; /* (nothing filled: an empty reply, the end of the listing) */
    }
    if (path && (flags & listing.plus) && accel_listing_fill(path, buf, (accel_filler)filler, offset, &count)) {
        if (count)
            mark_listed(fh, count);
        return 0;
    }
    return listing.fallback(path, buf, filler, offset, fi, flags);
}

PyObject *accel_listed(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    Py_ssize_t count;
    (void)self;
    if (!PyArg_ParseTuple(args, "Kn", &fh, &count))
        return NULL;
    if (count >= 0)
        mark_listed(fh, (uint64_t)count);
    Py_RETURN_NONE;
}

PyObject *accel_readdir_gate(PyObject *self, PyObject *args)
{
    unsigned long long fallback;
    Py_ssize_t fh_offset, stat_size;
    int plus;
    (void)self;
    if (!PyArg_ParseTuple(args, "Knni", &fallback, &fh_offset, &stat_size, &plus))
        return NULL;
    if (!fallback || !accel_field_in(fh_offset, 40, sizeof(uint64_t)) || stat_size != (Py_ssize_t)sizeof(struct stat)
        || plus <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "readdir_gate: no fallback or plus flag, fh outside fuse_file_info, or another struct stat");
        return NULL;
    }
    struct readdir_settings want;
    memset(&want, 0, sizeof want);
    want.fallback = (highlevel_readdir)(uintptr_t)fallback;
    want.fh_offset = fh_offset;
    want.plus = plus;
    if (!accel_keep_once(&listing, &want, sizeof want, &listing_taken, "readdir_gate: another one gated"))
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)readdir_gated);
}

PyObject *accel_opendir_gate(PyObject *self, PyObject *args)
{
    unsigned long long fallback, context;
    Py_ssize_t uid_offset, fh_offset, offset;
    unsigned long mask;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKnnnk", &fallback, &context, &uid_offset, &fh_offset, &offset, &mask))
        return NULL;
    /* (fuse_context: 24 bytes and more; fuse_file_info: 40 bytes and more, fh 8-aligned) */
    if (!fallback || !context || !accel_field_in(uid_offset, 24, sizeof(uint32_t))
        || !accel_field_in(fh_offset, 40, sizeof(uint64_t)) || !accel_field_in(offset, 40, sizeof(uint32_t))
        || (offset < fh_offset + 8 && fh_offset < offset + 4) || !mask || mask > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "opendir_gate: no fallback or context, or fields outside their structs");
        return NULL;
    }
    struct opendir_settings want;
    memset(&want, 0, sizeof want);
    want.fallback = (highlevel_opendir)(uintptr_t)fallback;
    want.context = (context_getter)(uintptr_t)context;
    want.uid_offset = uid_offset;
    want.fh_offset = fh_offset;
    want.offset = offset;
    want.mask = (uint32_t)mask;
    if (!accel_keep_once(&gate, &want, sizeof want, &gate_taken, "opendir_gate: already gates another opendir"))
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)opendir_gated);
}

int accel_root_opens_gated(void)
{
    return gate_taken;
}
