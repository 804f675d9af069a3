/* compatfs._accel: optional compiled kernels, each giving the same bytes as
 * its numpy counterpart (the tests compare the two).  Built by setup.py where
 * a C compiler is at hand; compatfs.translate.accel falls back to numpy
 * without it.
 *
 * mxfp4_repack(dst, src, width, stride, first, count): MXFP4 blocks from the
 * checkpoint's nibble order (byte k of a block's 16 data bytes: elements 2k
 * in the low nibble, 2k+1 in the high one) into ggml's (byte j: elements j
 * and j+16), the E8M0 scale byte kept first.  The blocks are numbered as
 * rows of `width` blocks, row r at byte r * stride of `src`: output block i
 * (17 bytes at 17 * i of `dst`) is input block first + i.  Runs without the
 * GIL.
 *
 * gather_read(fd, dst, offset, unit, stride, count, period): `count` runs of
 * `unit` bytes of the file `fd` holds, run i from byte offset + i * stride,
 * read straight into `dst` at i * period: the file's span from `offset` to
 * the end of the last run read with preadv in one pass, each run's bytes
 * scattered into its place in `dst` and the bytes between runs into one
 * small buffer that is thrown away (what compatfs.view.assemble otherwise
 * does by reading the span into scratch memory and copying the runs out with
 * numpy).  Returns the bytes of the span read: fewer than its size where the
 * file ends first.  Runs without the GIL; OSError as preadv fails.
 *
 * keep_opendir(original, offset, mask): the address of a libfuse 3
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
 * readdir_gate(fallback, fh_offset): the address of a libfuse 3 high-level
 * readdir (`int (*)(const char *path, void *buf, fuse_fill_dir_t filler,
 * off_t offset, struct fuse_file_info *fi, enum fuse_readdir_flags)`) that
 * answers a request from an offset at or past the end of a folder listed to
 * its end (`listed(fh, count)`, the fh the 64-bit word `fh_offset` bytes
 * into the fuse_file_info) with nothing filled: the empty reply that ends
 * the listing, which a caller's last getdents asks for after every folder,
 * without a Python callback.  Every other request goes to `fallback`, the
 * Python one.  A folder's count sits in one of 4096 slots by its fh (never
 * reused): one listed later in the same slot only sends the request to
 * `fallback`.  One gate per process; ValueError for another.
 *
 * polling_io(spin_ns, watch_ns, releasedir_in_c): the address of a libfuse 3
 * `struct fuse_custom_io` (zeroed past its writev and read, so a libfuse
 * whose struct is longer finds its further members unset) whose writev is
 * writev(2) and whose read is read(2) of the session's device, with turns
 * while a listing goes on.  A request answered in C with nothing to wait
 * for (root's OPENDIR where opendir_gate is installed; RELEASEDIR where
 * `releasedir_in_c`: the high-level library answers it; FORGET) starts listing
 * mode: its reader takes the turn, keeps it while it answers, and at its
 * next read first polls the device without waiting for up to `spin_ns`
 * nanoseconds.  In listing mode only the worker with the turn reads; the
 * others wait for it (a condition variable), so the kernel has no sleeping
 * reader to wake for each request, and a caller listing folder after folder
 * finds its next request taken by a thread still running (on a virtual
 * machine an idle core's wake-up costs more than answering the request).
 * Another listing's request (answered in Python) keeps the turn with its
 * reader too, under a watch: one whose answer takes longer than `watch_ns`
 * nanoseconds ends listing mode (a timerfd the reader arms, read by a
 * watching thread), so it holds up no other request longer than that.
 * Any other request ends listing mode and every waiting worker goes back
 * to read(2).  A worker cancelled while it waits, polls or reads (the
 * loop's end) passes the turn on.  What compatfs.fuse.polling hands
 * fuse_session_custom_io, where the loop's workers run until it ends.
 * One setting per process; ValueError for another (or OSError where the
 * watch cannot be set up).
 *
 * polled(): how many requests a worker found while polling so far. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 17

#if defined(__SSE2__)
#include <emmintrin.h>

/* The 16 data bytes' low and high nibbles apart; bytes 8-15 of each moved
 * under bytes 0-7 a nibble up (no bit crosses a byte: each is below 16);
 * the two interleaved byte by byte are ggml's 16 data bytes. */
static inline void repack_block(uint8_t *out, const uint8_t *in)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(in + 1)), m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    __m128i even = _mm_or_si128(lo, _mm_slli_epi16(_mm_srli_si128(lo, 8), 4));
    __m128i odd = _mm_or_si128(hi, _mm_slli_epi16(_mm_srli_si128(hi, 8), 4));
    out[0] = in[0];
    _mm_storeu_si128((__m128i *)(out + 1), _mm_unpacklo_epi8(even, odd));
}
#else
static const uint64_t LOW = 0x0F0F0F0F0F0F0F0FULL;

/* The 4 bytes of x each widened to a 16-bit lane, in the lane's low byte. */
static inline uint64_t spread(uint32_t x)
{
    uint64_t v = x;
    v = (v | (v << 16)) & 0x0000FFFF0000FFFFULL;
    v = (v | (v << 8)) & 0x00FF00FF00FF00FFULL;
    return v;
}

/* ggml byte 2i: L[i]'s low nibble under H[i]'s low one; byte 2i+1: L[i]'s
 * high nibble under H[i]'s high one (L: data bytes 0-7, H: 8-15). */
static inline void repack_block(uint8_t *out, const uint8_t *in)
{
    uint64_t l, h;
    memcpy(&l, in + 1, 8);
    memcpy(&h, in + 9, 8);
    uint64_t even = (l & LOW) | ((h & LOW) << 4);
    uint64_t odd = ((l >> 4) & LOW) | (h & ~LOW);
    uint64_t w0 = spread((uint32_t)even) | (spread((uint32_t)odd) << 8);
    uint64_t w1 = spread((uint32_t)(even >> 32)) | (spread((uint32_t)(odd >> 32)) << 8);
    out[0] = in[0];
    memcpy(out + 1, &w0, 8);
    memcpy(out + 9, &w1, 8);
}
#endif

static PyObject *mxfp4_repack(PyObject *self, PyObject *args)
{
    Py_buffer dst, src;
    Py_ssize_t width, stride, first, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*nnnn", &dst, &src, &width, &stride, &first, &count))
        return NULL;
    const char *bad = NULL;
    if (width <= 0 || width > PY_SSIZE_T_MAX / BLOCK || stride < 0 || first < 0 || count < 0
            || first > PY_SSIZE_T_MAX - count)
        bad = "mxfp4_repack: negative or oversized width, stride, first or count";
    else if (count > dst.len / BLOCK)
        bad = "mxfp4_repack: the output buffer is shorter than count blocks";
    else if (count) {
        Py_ssize_t r1 = (first + count - 1) / width, c1 = (first + count - 1) % width;
        /* the furthest block: the last one, or the end of the row before it */
        Py_ssize_t rows_before = r1 > first / width ? r1 - 1 : -1;
        if (r1 > (PY_SSIZE_T_MAX - width * BLOCK) / (stride ? stride : 1))
            bad = "mxfp4_repack: rows beyond any buffer";
        else if (r1 * stride + (c1 + 1) * BLOCK > src.len
                 || (rows_before >= 0 && rows_before * stride + width * BLOCK > src.len))
            bad = "mxfp4_repack: the input buffer is shorter than the blocks it must hold";
    }
    if (bad) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    uint8_t *out = dst.buf;
    const uint8_t *in = src.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t r = first / width, c = first % width;
    for (Py_ssize_t i = 0; i < count; i++) {
        repack_block(out + i * BLOCK, in + r * stride + c * BLOCK);
        if (++c == width) {
            c = 0;
            r++;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* The span's bytes from `done` on, as iovecs (at most IOV_MAX) into `iov`:
 * run i's bytes into out + i * period, the gap after it into `junk`.
 * Returns how many iovecs were made. */
static int span_iovecs(struct iovec *iov, uint8_t *out, uint8_t *junk, Py_ssize_t unit, Py_ssize_t stride,
                       Py_ssize_t count, Py_ssize_t period, Py_ssize_t done)
{
    int n = 0;
    Py_ssize_t i = done / stride, at = done % stride;
    while (i < count && n < IOV_MAX) {
        if (at < unit) {
            iov[n].iov_base = out + i * period + at;
            iov[n].iov_len = (size_t)(unit - at);
            n++;
            at = unit;
        } else if (i + 1 < count) {
            if (stride > at) {
                iov[n].iov_base = junk;
                iov[n].iov_len = (size_t)(stride - at);
                n++;
            }
            at = 0;
            i++;
        } else {
            break;
        }
    }
    return n;
}

static PyObject *gather_read(PyObject *self, PyObject *args)
{
    Py_buffer dst;
    int fd;
    long long offset;
    Py_ssize_t unit, stride, count, period;
    (void)self;
    if (!PyArg_ParseTuple(args, "iw*Lnnnn", &fd, &dst, &offset, &unit, &stride, &count, &period))
        return NULL;
    const char *bad = NULL;
    if (fd < 0 || offset < 0 || unit <= 0 || stride < unit || period < unit || count <= 0)
        bad = "gather_read: a negative descriptor or offset, runs of no bytes, or runs that overlap";
    else if (count - 1 > (PY_SSIZE_T_MAX - unit) / stride || count - 1 > (PY_SSIZE_T_MAX - unit) / period
             || (count - 1) * stride + unit > LLONG_MAX - offset)
        bad = "gather_read: runs beyond any file or buffer";
    else if ((count - 1) * period + unit > dst.len)
        bad = "gather_read: the output buffer is shorter than the runs it must hold";
    if (bad) {
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    Py_ssize_t span = (count - 1) * stride + unit, done = 0;
    uint8_t *junk = malloc(stride > unit ? (size_t)(stride - unit) : 1);
    struct iovec *iov = malloc(sizeof(struct iovec) * IOV_MAX);
    if (!junk || !iov) {
        free(junk);
        free(iov);
        PyBuffer_Release(&dst);
        return PyErr_NoMemory();
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < span) {
        int n = span_iovecs(iov, dst.buf, junk, unit, stride, count, period, done);
        ssize_t got = preadv(fd, iov, n, (off_t)(offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (got == 0)
            break;
        done += got;
    }
    Py_END_ALLOW_THREADS
    free(junk);
    free(iov);
    PyBuffer_Release(&dst);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(done);
}

typedef void (*lowlevel_opendir)(void *req, uint64_t ino, void *fi);

static lowlevel_opendir kept_original;
static Py_ssize_t kept_offset;
static uint32_t kept_mask;

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
    set_bits(fi, kept_offset, kept_mask);
    kept_original(req, ino, fi);
}

static PyObject *keep_opendir(PyObject *self, PyObject *args)
{
    unsigned long long original;
    Py_ssize_t offset;
    unsigned long mask;
    (void)self;
    if (!PyArg_ParseTuple(args, "Knk", &original, &offset, &mask))
        return NULL;
    if (!original || offset < 0 || offset > 64 - (Py_ssize_t)sizeof(uint32_t) || offset % sizeof(uint32_t)
        || !mask || mask > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "keep_opendir: no original, or bits outside fuse_file_info's words");
        return NULL;
    }
    lowlevel_opendir fn = (lowlevel_opendir)(uintptr_t)original;
    if (kept_original && (kept_original != fn || kept_offset != offset || kept_mask != (uint32_t)mask)) {
        PyErr_SetString(PyExc_ValueError, "keep_opendir: already wraps another opendir");
        return NULL;
    }
    kept_offset = offset;
    kept_mask = (uint32_t)mask;
    kept_original = fn;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)opendir_keeping);
}

typedef int (*highlevel_opendir)(const char *path, void *fi);
typedef void *(*context_getter)(void);

static atomic_ullong dir_handles = 1; /* the fh of the next folder opened (0: none) */
static highlevel_opendir gate_fallback;
static context_getter gate_context;
static Py_ssize_t gate_uid_offset, gate_fh_offset, gate_offset;
static uint32_t gate_mask;

static int opendir_gated(const char *path, void *fi)
{
    const char *ctx = gate_context();
    uint32_t uid;
    if (!ctx)
        return gate_fallback(path, fi);
    memcpy(&uid, ctx + gate_uid_offset, sizeof uid);
    if (uid != 0)
        return gate_fallback(path, fi);
    uint64_t fh = atomic_fetch_add(&dir_handles, 1);
    memcpy((char *)fi + gate_fh_offset, &fh, sizeof fh);
    set_bits(fi, gate_offset, gate_mask);
    return 0;
}

static PyObject *dir_handle(PyObject *self, PyObject *unused)
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
static highlevel_readdir readdir_fallback;
static Py_ssize_t readdir_fh_offset;

static int readdir_gated(const char *path, void *buf, void *filler, int64_t offset, void *fi, int flags)
{
    if (offset > 0) {
        uint64_t fh, slot;
        memcpy(&fh, (char *)fi + readdir_fh_offset, sizeof fh);
        slot = atomic_load(&listed_slots[fh % LISTED_SLOTS]);
        if (fh && slot >> LISTED_COUNT_BITS == fh
            && (uint64_t)offset >= (slot & ((1u << LISTED_COUNT_BITS) - 1)))
            return 0; /* (nothing filled: an empty reply, the end of the listing) */
    }
    return readdir_fallback(path, buf, filler, offset, fi, flags);
}

static PyObject *listed(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    Py_ssize_t count;
    (void)self;
    if (!PyArg_ParseTuple(args, "Kn", &fh, &count))
        return NULL;
    if (fh && fh < (1ULL << (64 - LISTED_COUNT_BITS)) && count >= 0 && count < (1 << LISTED_COUNT_BITS))
        atomic_store(&listed_slots[fh % LISTED_SLOTS], fh << LISTED_COUNT_BITS | (uint64_t)count);
    Py_RETURN_NONE;
}

static PyObject *readdir_gate(PyObject *self, PyObject *args)
{
    unsigned long long fallback;
    Py_ssize_t fh_offset;
    (void)self;
    if (!PyArg_ParseTuple(args, "Kn", &fallback, &fh_offset))
        return NULL;
    highlevel_readdir fn = (highlevel_readdir)(uintptr_t)fallback;
    if (!fallback || fh_offset < 0 || fh_offset > 40 - (Py_ssize_t)sizeof(uint64_t) || fh_offset % sizeof(uint64_t)
        || (readdir_fallback && (readdir_fallback != fn || readdir_fh_offset != fh_offset))) {
        PyErr_SetString(PyExc_ValueError, "readdir_gate: no fallback, fh outside fuse_file_info, or another one gated");
        return NULL;
    }
    readdir_fh_offset = fh_offset;
    readdir_fallback = fn;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)readdir_gated);
}

static PyObject *opendir_gate(PyObject *self, PyObject *args)
{
    unsigned long long fallback, context;
    Py_ssize_t uid_offset, fh_offset, offset;
    unsigned long mask;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKnnnk", &fallback, &context, &uid_offset, &fh_offset, &offset, &mask))
        return NULL;
    /* (fuse_context: 24 bytes and more; fuse_file_info: 40 bytes and more, fh 8-aligned) */
    if (!fallback || !context || uid_offset < 0 || uid_offset > 24 - (Py_ssize_t)sizeof(uint32_t)
        || uid_offset % sizeof(uint32_t) || fh_offset < 0 || fh_offset > 40 - (Py_ssize_t)sizeof(uint64_t)
        || fh_offset % sizeof(uint64_t) || offset < 0 || offset > 40 - (Py_ssize_t)sizeof(uint32_t)
        || offset % sizeof(uint32_t) || (offset < fh_offset + 8 && fh_offset < offset + 4) || !mask
        || mask > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "opendir_gate: no fallback or context, or fields outside their structs");
        return NULL;
    }
    highlevel_opendir fn = (highlevel_opendir)(uintptr_t)fallback;
    context_getter get = (context_getter)(uintptr_t)context;
    if (gate_fallback
        && (gate_fallback != fn || gate_context != get || gate_uid_offset != uid_offset
            || gate_fh_offset != fh_offset || gate_offset != offset || gate_mask != (uint32_t)mask)) {
        PyErr_SetString(PyExc_ValueError, "opendir_gate: already gates another opendir");
        return NULL;
    }
    gate_context = get;
    gate_uid_offset = uid_offset;
    gate_fh_offset = fh_offset;
    gate_offset = offset;
    gate_mask = (uint32_t)mask;
    gate_fallback = fn;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)opendir_gated);
}

/* libfuse 3's struct fuse_custom_io, 3.14 on: writev, read, splice_receive,
 * splice_send; later ones add members after them (left NULL here). */
struct custom_io {
    ssize_t (*writev)(int fd, struct iovec *iov, int count, void *userdata);
    ssize_t (*read)(int fd, void *buf, size_t len, void *userdata);
    void *unset[14];
};

static long long spin_ns, watch_ns;
static int releasedir_in_c;          /* the high-level library answers RELEASEDIR itself */
static int watch_fd = -1;            /* a timerfd armed while the turn's holder answers in Python */
static atomic_ullong polled_total;
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_free = PTHREAD_COND_INITIALIZER;
static atomic_int listing_mode;      /* a quick request came last: idle workers wait for the turn */
static int turn_taken;               /* a worker has the turn (under turn_lock) */
static atomic_uint turn_epoch;       /* moved on when the watch ends listing mode */
static __thread int holding;         /* this worker had the turn ... */
static __thread unsigned held_epoch; /* ... in this epoch (it still has it if the epoch is the same) */
static __thread int watched;         /* this worker armed the watch */

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    (void)userdata;
    return writev(fd, iov, count);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int is_listing(uint32_t opcode)
{
    switch (opcode) {
    case FUSE_LOOKUP:
    case FUSE_GETATTR:
    case FUSE_OPENDIR:
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
    case FUSE_RELEASEDIR:
    case FUSE_STATFS:
        return 1;
    default:
        return 0;
    }
}

/* Whether the request is answered in C with nothing to wait for: a folder
 * closed (where the high-level library answers it), opened by root (where
 * opendir_gate answers it), or a node forgotten (the high-level library
 * drops it; no answer). */
static int answered_in_c(const struct fuse_in_header *head)
{
    return (head->opcode == FUSE_RELEASEDIR && releasedir_in_c)
           || (head->opcode == FUSE_OPENDIR && head->uid == 0 && gate_fallback) || head->opcode == FUSE_FORGET
           || head->opcode == FUSE_BATCH_FORGET;
}

/* Poll `fd` without waiting until it has a request, for spin_ns at most;
 * whether it has one. */
static int poll_briefly(int fd)
{
    long long until = now_ns() + spin_ns;
    do {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 0);
        if (r != 0)
            return r > 0 && (p.revents & POLLIN); /* (or an error, or a signal: read says which) */
    } while (now_ns() < until);
    return 0;
}

static void unlock_turn(void *unused)
{
    (void)unused;
    pthread_mutex_unlock(&turn_lock);
}

/* Under turn_lock: this worker gives up the turn it has (to one waiting worker). */
static void pass_turn(void)
{
    if (holding && held_epoch == atomic_load(&turn_epoch)) {
        turn_taken = 0;
        pthread_cond_signal(&turn_free);
    }
    holding = 0;
}

/* After a request is read (`quick`: answered in C; `listing`: a listing's),
 * under turn_lock: a quick one keeps the turn with its reader, or gives it
 * the turn no one has, in listing mode (started again where another
 * request ended it meanwhile); another listing's keeps the turn with its
 * reader under the watch (or passes it to one waiting worker where the
 * watch cannot be armed); anything else ends listing mode, and every
 * waiting worker goes back to waiting in read. */
static void after_read(int quick, int listing)
{
    if (holding && held_epoch != atomic_load(&turn_epoch))
        holding = 0; /* (the watch ended listing mode since this worker read) */
    if (quick) {
        if (holding || !turn_taken) {
            atomic_store(&listing_mode, 1);
            turn_taken = holding = 1;
            held_epoch = atomic_load(&turn_epoch);
        }
        return;
    }
    if (listing && holding) {
        struct itimerspec at = {.it_value = {watch_ns / 1000000000LL, watch_ns % 1000000000LL}};
        watched = timerfd_settime(watch_fd, 0, &at, NULL) == 0;
        if (watched)
            return;
    }
    pass_turn();
    if (!listing && atomic_load(&listing_mode)) {
        atomic_store(&listing_mode, 0);
        pthread_cond_broadcast(&turn_free);
    }
}

/* A worker cancelled while it polls or reads with the turn passes it on. */
static void drop_turn(void *unused)
{
    (void)unused;
    if (!holding)
        return;
    pthread_mutex_lock(&turn_lock);
    pass_turn();
    pthread_mutex_unlock(&turn_lock);
}

/* The watching thread: each time the watch runs out, listing mode ends (a
 * new epoch: the holder finds it no longer has the turn) and every waiting
 * worker goes back to read(2).  Ending it early (the answer came just as
 * it ran out) only costs the next requests a wake-up. */
static void *watch_turns(void *unused)
{
    (void)unused;
    uint64_t expired;
    for (;;) {
        if (read(watch_fd, &expired, sizeof expired) != (ssize_t)sizeof expired) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return NULL;
        }
        pthread_mutex_lock(&turn_lock);
        if (atomic_load(&listing_mode)) {
            atomic_fetch_add(&turn_epoch, 1);
            atomic_store(&listing_mode, 0);
            turn_taken = 0;
            pthread_cond_broadcast(&turn_free);
        }
        pthread_mutex_unlock(&turn_lock);
    }
}

/* At a worker's next read (its last request answered): the watch it armed
 * disarmed; whether it still has the turn (the watch ended listing mode
 * while it answered where not). */
static int answered(void)
{
    if (watched) {
        /* (under the lock: where the watch ended listing mode meanwhile,
         * another worker may have the turn and the watch armed again) */
        struct itimerspec off = {{0, 0}, {0, 0}};
        pthread_mutex_lock(&turn_lock);
        if (held_epoch == atomic_load(&turn_epoch))
            timerfd_settime(watch_fd, 0, &off, NULL);
        pthread_mutex_unlock(&turn_lock);
        watched = 0;
    }
    if (holding && held_epoch != atomic_load(&turn_epoch))
        holding = 0;
    return holding;
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
    (void)userdata;
    struct fuse_in_header head;
    ssize_t n;
    int err, whole, quick, listing, kept = answered();
    if (!holding && atomic_load(&listing_mode)) {
        pthread_mutex_lock(&turn_lock);
        pthread_cleanup_push(unlock_turn, NULL); /* (cond_wait is a cancellation point: the loop's end cancels workers) */
        while (atomic_load(&listing_mode) && turn_taken)
            pthread_cond_wait(&turn_free, &turn_lock);
        if (atomic_load(&listing_mode)) {
            turn_taken = holding = 1;
            held_epoch = atomic_load(&turn_epoch);
        }
        pthread_cleanup_pop(1);
    }
    pthread_cleanup_push(drop_turn, NULL);
    if (kept && poll_briefly(fd))
        atomic_fetch_add(&polled_total, 1);
    n = read(fd, buf, len);
    err = errno;
    pthread_cleanup_pop(0);
    whole = n >= (ssize_t)sizeof head; /* (else an error: read says which) */
    if (whole)
        memcpy(&head, buf, sizeof head);
    quick = whole && answered_in_c(&head);
    listing = whole && is_listing(head.opcode);
    if (holding || quick || (!listing && atomic_load(&listing_mode))) {
        pthread_mutex_lock(&turn_lock);
        after_read(quick, listing);
        pthread_mutex_unlock(&turn_lock);
    }
    errno = err;
    return n;
}

static struct custom_io polling = {.writev = io_writev, .read = io_read};

static PyObject *polling_io(PyObject *self, PyObject *args)
{
    long long ns, watch;
    int releasedir;
    pthread_t watcher;
    (void)self;
    if (!PyArg_ParseTuple(args, "LLp", &ns, &watch, &releasedir))
        return NULL;
    if (ns <= 0 || ns > 1000000000LL || watch <= 0 || watch > 1000000000LL
        || (spin_ns && (spin_ns != ns || watch_ns != watch || releasedir_in_c != releasedir))) {
        PyErr_SetString(PyExc_ValueError, "polling_io: spin or watch outside (0, 1 s], or another one set already");
        return NULL;
    }
    if (watch_fd < 0) {
        int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
        if (fd < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        watch_fd = fd;
        int err = pthread_create(&watcher, NULL, watch_turns, NULL);
        if (err) {
            close(fd);
            watch_fd = -1;
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        pthread_detach(watcher);
    }
    spin_ns = ns;
    watch_ns = watch;
    releasedir_in_c = releasedir;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&polling);
}

static PyObject *polled(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&polled_total));
}

static PyMethodDef methods[] = {
    {"mxfp4_repack", mxfp4_repack, METH_VARARGS,
     "mxfp4_repack(dst, src, width, stride, first, count): MXFP4 blocks first .. first + count - 1 of src "
     "(rows of width blocks, stride bytes apart) from the checkpoint's nibble order into ggml's, into dst."},
    {"gather_read", gather_read, METH_VARARGS,
     "gather_read(fd, dst, offset, unit, stride, count, period): count runs of unit bytes of file fd, run i at "
     "offset + i * stride, read into dst at i * period in one pass over the file; the bytes of the span read."},
    {"keep_opendir", keep_opendir, METH_VARARGS,
     "keep_opendir(original, offset, mask): the address of a libfuse low-level opendir that sets mask in the "
     "32-bit word offset bytes into the request's fuse_file_info, then calls original."},
    {"opendir_gate", opendir_gate, METH_VARARGS,
     "opendir_gate(fallback, context, uid_offset, fh_offset, offset, mask): the address of a libfuse high-level "
     "opendir that answers root's opens itself (fh a dir_handle, mask set in the word offset bytes into fuse_file_info) and "
     "passes every other to fallback."},
    {"dir_handle", dir_handle, METH_NOARGS, "dir_handle(): a folder's fh no other open of a folder has (never 0)."},
    {"listed", listed, METH_VARARGS,
     "listed(fh, count): the folder open as fh was listed to its end, count entries (one call per listing: "
     "readdir_gate answers a later request for it from an offset at or past count with nothing)."},
    {"readdir_gate", readdir_gate, METH_VARARGS,
     "readdir_gate(fallback, fh_offset): the address of a libfuse 3 high-level readdir that answers a request from "
     "an offset at or past the count `listed` gave for the fh (the 64-bit word fh_offset bytes into fuse_file_info) "
     "with nothing, and passes every other one to fallback."},
    {"polling_io", polling_io, METH_VARARGS,
     "polling_io(spin_ns, watch_ns, releasedir_in_c): the address of a libfuse 3 fuse_custom_io whose read lets one "
     "worker at a time read the device while a listing goes on, the one that answered a request in C polling up to "
     "spin_ns first; an answer in Python that takes longer than watch_ns ends it."},
    {"polled", polled, METH_NOARGS, "polled(): the requests found by a polling worker so far."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "compatfs._accel", "compatfs's optional compiled kernels.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__accel(void)
{
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "compatfs._accel assumes a little-endian machine");
    return NULL;
#else
    return PyModule_Create(&module);
#endif
}
