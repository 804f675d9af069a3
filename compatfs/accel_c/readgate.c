/* Reads of an open file's plain ranges answered in C, with no Python
 * callback and the GIL never taken.
 *
 * read_gate(fallback, fh_offset, vec_size, count_offset, size_offset,
 * mem_offset): the address of a libfuse 3 high-level read_buf (`int
 * (*)(const char *path, struct fuse_bufvec **bufp, size_t size, off_t off,
 * struct fuse_file_info *fi)`) that answers a read of an open file with a
 * plan (`read_plan`, under the fh the 64-bit word fh_offset bytes into the
 * fuse_file_info) itself, and passes every other read to `fallback`, the
 * Python one, whose answer it returns.  Its reply is what the Python one
 * makes: one page-aligned malloc'ed buffer in a bufvec of `vec_size` bytes
 * (count, the buffer's size and mem at those offsets), both freed by
 * libfuse.  One gate per process; ValueError for another.
 *
 * A read is answered in C only where all of this holds, else it goes to
 * `fallback` (which judges the file as it always does, and fails the read
 * or serves it):
 * - the plan is alive: no check below failed for it before;
 * - the file's status (fstat of the plan's own descriptor) is the plan's
 *   identity (device, inode, size, modification and change time), and for
 *   a followed file no inotify event is queued on `watch_fd` and none was
 *   taken in since the plan was made (`read_events` counts each batch
 *   before it is read);
 * - every byte from `off` to `off + size + window` (or the view's end) lies
 *   in the plan's segments: blob ranges, zeros, rows of the blob copied or
 *   repacked from MXFP4 and the header the plan holds (a range before an
 *   op tensor of another kind, or in a header not held, goes to Python,
 *   which computes ahead);
 * - every blob byte read as BlobFile.read_once_into reads it: pread, in
 *   full, then where the plan drops behind (`lag` not -1) the blob's pages
 *   given back as BlobFile.passed gives them back (POSIX_FADV_DONTNEED):
 *   the whole blocks of `unit` bytes that end in the read's bytes moved
 *   `lag` back;
 * - the same checks pass again once the bytes are in.
 * A read of rows whose segment has a kin (the other half of an interleaved
 * stack) and a plan that makes stores also makes the kin's same rows from
 * the same read of the blob, as whole pages of the file within the kin,
 * and queues them (stores.c) once the checks after the read pass.
 * A check of the file that fails, or a read that fails or comes short,
 * kills the plan (the Python read then decides; `read_planned` says the
 * plan is gone, and Python makes another once it finds the file intact).
 *
 * read_plan(fh, fd, lag, unit, identity, watch_fd, generation, segments,
 * held, view_size, window, stores): the plan of open file fh (replacing one
 * it had): the file's descriptor, which stays open until fh is released (the
 * kernel sends that release once no read of fh is under way, and none comes
 * after it), how reads drop behind (`lag` -1: they do not), the identity
 * (dev, ino, size, mtime_ns, ctime_ns) it must keep (a descriptor closed, or
 * its number taken by another file, fails the checks), watch_fd (-1: not
 * followed), the generation of `read_generation` taken before the file was
 * last found intact, its segments: signed 64-bit octuples (at, size, lo,
 * kind, origin, row, stride, kin), in view order: kind 0 blob bytes [lo, lo
 * + size), 1 zeros, 3 bytes [lo, lo + size) of `held` (the rendered header,
 * copied into the plan), and the rows kinds: bytes [lo, lo + size) of an
 * output whose row r (`row` bytes) is made from the `row` blob bytes at
 * origin + r * stride, kind 4 copied, kind 2 MXFP4 blocks in the
 * checkpoint's nibble order repacked into ggml's (as `mxfp4_repack` does),
 * with `kin` the view offset of the kin's output byte 0 (-1: none; see
 * `rows_sound`); origin, row and stride say nothing for the other kinds (0,
 * and kin -1), and whether reads make kin pages (`stores`).
 * read_forget(fh): the plan of fh gone (before its descriptor is closed).
 * read_planned(fh): whether fh has a plan still alive.
 * read_events(): a batch of inotify events is about to be taken in.
 * read_generation(): how many batches so far.
 * read_served(): reads answered in C so far. */
#include "accel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALIGN 4096
#define SPAN (1 << 20) /* the buffer rows are read into: bytes of the blob read at once */
#define SPANS_KEPT 8
#define SLOTS 1024

enum { BLOB_BYTES, ZEROS, MXFP4, HELD_BYTES, ROWS, KINDS };
#define MXFP4_BLOCK 17
#define IS_ROWS(kind) ((kind) == MXFP4 || (kind) == ROWS)
#define MADE_MOST 4 /* kin page ranges one read makes, at most */

typedef struct {
    int64_t at, size, lo, kind, origin, row, stride, kin;
} segment;

/* Kin pages one read made: `size` bytes at mem, the view's from `offset`. */
typedef struct {
    int64_t offset, size;
    void *mem;
} made;

typedef struct plan {
    struct plan *next; /* in its slot */
    uint64_t fh;
    _Atomic int refs; /* the table's, and each read's using it */
    _Atomic int dead;
    int fd, watch_fd;
    int64_t lag, unit; /* how reads drop behind (lag -1: they do not) */
    uint64_t dev, ino;
    int64_t size, mtime, ctime;
    uint64_t generation;
    int64_t view_size, window;
    int stores; /* whether reads make kin pages (stores.c) */
    Py_ssize_t count;
    segment *segs;
    uint8_t *held; /* the bytes held segments are taken from */
    int64_t held_size;
} plan;

typedef int (*highlevel_read_buf)(const char *path, void **bufp, size_t size, int64_t off, void *fi);

struct gate_settings {
    highlevel_read_buf fallback;
    Py_ssize_t fh_offset, vec_size, count_offset, size_offset, mem_offset;
};
static struct gate_settings gate;
static int gate_taken;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static plan *slots[SLOTS];
static _Atomic uint64_t generation;
static _Atomic uint64_t served;
static pthread_mutex_t span_lock = PTHREAD_MUTEX_INITIALIZER;
static void *spans[SPANS_KEPT];
static int spans_kept;

static void plan_free(plan *p)
{
    free(p->segs);
    free(p->held);
    free(p);
}

static void plan_release(plan *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1)
        plan_free(p);
}

/* fh's plan with a reference taken, or NULL. */
static plan *plan_take(uint64_t fh)
{
    pthread_mutex_lock(&table_lock);
    plan *p = slots[fh % SLOTS];
    while (p && p->fh != fh)
        p = p->next;
    if (p)
        atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&table_lock);
    return p;
}

/* fh's plan out of the table (the table's reference is the caller's), or NULL. */
static plan *plan_unlink(uint64_t fh)
{
    plan **at = &slots[fh % SLOTS];
    while (*at && (*at)->fh != fh)
        at = &(*at)->next;
    plan *p = *at;
    if (p)
        *at = p->next;
    return p;
}

static void *span_take(void)
{
    void *b = NULL;
    pthread_mutex_lock(&span_lock);
    if (spans_kept)
        b = spans[--spans_kept];
    pthread_mutex_unlock(&span_lock);
    return b ? b : malloc(SPAN);
}

static void span_give(void *b)
{
    pthread_mutex_lock(&span_lock);
    if (spans_kept < SPANS_KEPT) {
        spans[spans_kept++] = b;
        b = NULL;
    }
    pthread_mutex_unlock(&span_lock);
    free(b);
}

/* Whether descriptor fd holds the file of the plan's identity. */
static int same_file(plan *p, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0;
    return (uint64_t)st.st_dev == p->dev && (uint64_t)st.st_ino == p->ino && (int64_t)st.st_size == p->size
           && (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec == p->mtime
           && (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec == p->ctime;
}

/* Whether the file is as the plan has it: its descriptor of its identity,
 * and (followed) no event queued or taken in since the plan was made. */
static int plan_holds(plan *p)
{
    if (atomic_load(&p->dead))
        return 0;
    if (p->watch_fd >= 0) {
        struct pollfd q = {.fd = p->watch_fd, .events = POLLIN};
        if (poll(&q, 1, 0) != 0)
            return 0;
        if (atomic_load(&generation) != p->generation)
            return 0;
    }
    return same_file(p, p->fd);
}

/* Exactly n bytes at `at` of fd into out; 0, or -1 on a failure or the file ending first. */
static int read_full(int fd, uint8_t *out, int64_t n, int64_t at)
{
    while (n > 0) {
        ssize_t got = pread(fd, out, (size_t)n, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        out += got;
        at += got;
        n -= got;
    }
    return 0;
}

/* The blob's bytes [lo, lo + n) into out, as BlobFile.read_once_into reads them. */
static int read_piece(plan *p, uint8_t *out, int64_t n, int64_t lo)
{
    if (read_full(p->fd, out, n, lo))
        return -1;
    if (p->lag >= 0 && lo + n > p->lag) {
        int64_t from = lo > p->lag ? (lo - p->lag) / p->unit * p->unit : 0, to = (lo + n - p->lag) / p->unit * p->unit;
        if (from < to)
            posix_fadvise(p->fd, from, to - from, POSIX_FADV_DONTNEED);
    }
    return 0;
}

/* n bytes of a rows segment's output into out, from the input unit
 * (`unit` bytes: 1 copied, an MXFP4 block repacked) at `in`, `skip` bytes
 * into it; a unit cut by either end through one of its own. */
static void put(int64_t kind, uint8_t *out, const uint8_t *in, int64_t skip, int64_t n)
{
    if (kind == ROWS) {
        memcpy(out, in + skip, (size_t)n);
        return;
    }
    uint8_t one[MXFP4_BLOCK];
    if (skip) {
        int64_t take = MXFP4_BLOCK - skip < n ? MXFP4_BLOCK - skip : n;
        accel_mxfp4_blocks(one, in, 1);
        memcpy(out, one + skip, (size_t)take);
        out += take;
        in += MXFP4_BLOCK;
        n -= take;
    }
    int64_t whole = n / MXFP4_BLOCK;
    accel_mxfp4_blocks(out, in, whole);
    out += whole * MXFP4_BLOCK;
    in += whole * MXFP4_BLOCK;
    if (n -= whole * MXFP4_BLOCK) {
        accel_mxfp4_blocks(one, in, 1);
        memcpy(out, one, (size_t)n);
    }
}

/* A range of a rows segment's output being made: bytes [lo, hi) into `to`. */
typedef struct {
    const segment *seg;
    uint8_t *to;
    int64_t lo, hi;
} target;

/* Bytes [x, x + n) of rows segment s's output into out, and with kin
 * segment k (NULL: none) the kin's [kx, ke) into kout, from one read of
 * the rows both need: a span buffer's worth of rows at a time, read as
 * `read_piece` reads them. */
static int fill_rows(plan *p, const segment *s, uint8_t *out, int64_t x, int64_t n, const segment *k, uint8_t *kout,
                     int64_t kx, int64_t ke)
{
    const int64_t row = s->row, stride = s->stride, unit = s->kind == ROWS ? 1 : MXFP4_BLOCK;
    target t[2] = {{s, out, x, x + n}, {k, kout, kx, ke}};
    int targets = k ? 2 : 1;
    int64_t base = s->origin, top = s->origin, r0 = x / row, r1 = (x + n + row - 1) / row;
    if (k) {
        base = k->origin < base ? k->origin : base;
        top = k->origin > top ? k->origin : top;
        r0 = kx / row < r0 ? kx / row : r0;
        r1 = (ke + row - 1) / row > r1 ? (ke + row - 1) / row : r1;
    }
    const int64_t group = top - base + row; /* the input bytes one row of each target lies in */
    const int64_t most = (SPAN - group) / stride + 1; /* rows read at a time */
    uint8_t *buf = span_take();
    if (!buf)
        return -1;
    int failed = 0;
    for (int64_t ra = r0, rb; ra < r1 && !failed; ra = rb) {
        rb = r1 - ra < most ? r1 : ra + most;
        if (read_piece(p, buf, (rb - 1 - ra) * stride + group, base + ra * stride)) {
            failed = 1;
            break;
        }
        for (int j = 0; j < targets; j++) {
            int64_t a = t[j].lo > ra * row ? t[j].lo : ra * row, b = t[j].hi < rb * row ? t[j].hi : rb * row;
            const uint8_t *from = buf + (t[j].seg->origin - base);
            if (stride == row && a < b) { /* the rows lie end to end: one run */
                int64_t c = a - ra * row;
                put(s->kind, t[j].to + (a - t[j].lo), from + c - c % unit, c % unit, b - a);
                continue;
            }
            for (int64_t r = a / row; a < b; r++) {
                int64_t e = (r + 1) * row < b ? (r + 1) * row : b, c = a - r * row;
                put(s->kind, t[j].to + (a - t[j].lo), from + (r - ra) * stride + c - c % unit, c % unit, e - a);
                a = e;
            }
        }
    }
    span_give(buf);
    return failed ? -1 : 0;
}

/* The index of the first of the `count` segments at segs ending after `off` (count where none does). */
static Py_ssize_t ending_after(const segment *segs, Py_ssize_t count, int64_t off)
{
    Py_ssize_t lo = 0, hi = count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (segs[mid].at + segs[mid].size <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The index of the plan's first segment ending after `off` (its count where none does). */
static Py_ssize_t first_after(plan *p, int64_t off)
{
    return ending_after(p->segs, p->count, off);
}

/* Whether the segments from i on cover [off, end) without a gap. */
static int covered(plan *p, Py_ssize_t i, int64_t off, int64_t end)
{
    for (; off < end; i++) {
        if (i >= p->count || p->segs[i].at > off)
            return 0;
        off = p->segs[i].at + p->segs[i].size;
    }
    return 1;
}

/* The kin pages of rows segment s's output [x, x + n): its kin's same
 * bytes, widened to whole pages of the file (a page the kin starts or ends
 * in taken where the plan serves its other bytes, or the file ends with
 * it), in memory counted in `kin` (*kins of them); NULL where none is made:
 * none wanted (`kin` NULL), the plan makes none, MADE_MOST were made, no
 * page lies in them, or the queue is full. */
static made *kin_pages(plan *p, const segment *s, int64_t x, int64_t n, made *kin, int *kins)
{
    static int64_t page; /* the kernel's page size */
    if (!page)
        page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    if (!kin || s->kin < 0 || !p->stores || *kins >= MADE_MOST)
        return NULL;
    const segment *k = &p->segs[s->kin];
    int64_t zero = k->at - k->lo, end = k->at + k->size; /* the view's offsets of the kin's byte 0 and end */
    int64_t v0 = (zero + x) / page * page, v1 = (zero + x + n + page - 1) / page * page;
    if (v0 < k->at && !covered(p, first_after(p, v0), v0, k->at))
        v0 += page;
    if (v1 > end && !covered(p, first_after(p, end), end, v1 < p->view_size ? v1 : p->view_size))
        v1 -= page;
    if (v1 > p->view_size)
        v1 = p->view_size;
    uint8_t *mem = v1 > v0 ? accel_store_take(v1 - v0) : NULL;
    if (!mem)
        return NULL;
    kin[*kins] = (made){v0, v1 - v0, mem};
    return &kin[(*kins)++];
}

/* The view's bytes [off, off + n) into out from the segments from i on,
 * and where `kin` is given, the kin pages of rows segments (*kins of them). */
static int fill(plan *p, Py_ssize_t i, uint8_t *out, int64_t off, int64_t n, made *kin, int *kins)
{
    int64_t end = off + n;
    for (; off < end; i++) {
        segment *s = &p->segs[i];
        int64_t stop = s->at + s->size < end ? s->at + s->size : end, len = stop - off;
        int64_t lo = s->lo + (off - s->at);
        if (s->kind == ZEROS)
            memset(out, 0, (size_t)len);
        else if (s->kind == HELD_BYTES)
            memcpy(out, p->held + lo, (size_t)len);
        else if (s->kind == BLOB_BYTES) {
            if (read_piece(p, out, len, lo))
                return -1;
        } else {
            made *m = kin_pages(p, s, lo, len, kin, kins);
            if (!m) {
                if (fill_rows(p, s, out, lo, len, NULL, NULL, 0, 0))
                    return -1;
            } else { /* the kin's bytes, then the other segments' in the pages around them */
                const segment *k = &p->segs[s->kin];
                int64_t a = m->offset > k->at ? m->offset : k->at, z = m->offset + m->size;
                int64_t b = z < k->at + k->size ? z : k->at + k->size, zero = k->at - k->lo;
                uint8_t *pages = m->mem;
                if (fill_rows(p, s, out, lo, len, k, pages + (a - m->offset), a - zero, b - zero)
                    || fill(p, first_after(p, m->offset), pages, m->offset, a - m->offset, NULL, NULL)
                    || fill(p, first_after(p, b), pages + (b - m->offset), b, z - b, NULL, NULL))
                    return -1;
            }
        }
        out += len;
        off = stop;
    }
    return 0;
}

/* The reply's bufvec holding n bytes at mem, or NULL. */
static void *bufvec(void *mem, size_t n)
{
    uint8_t *vec = calloc(1, (size_t)gate.vec_size);
    if (vec) {
        size_t one = 1;
        memcpy(vec + gate.count_offset, &one, sizeof one);
        memcpy(vec + gate.size_offset, &n, sizeof n);
        memcpy(vec + gate.mem_offset, &mem, sizeof mem);
    }
    return vec;
}

/* 0 with the reply in *bufp where the plan answers the read, else -1 (nothing made). */
static int answer(plan *p, void **bufp, size_t size, int64_t off)
{
    if (off < 0 || off >= p->view_size)
        return -1;
    int64_t n = (int64_t)size < p->view_size - off ? (int64_t)size : p->view_size - off;
    int64_t until = off + (int64_t)size + p->window;
    Py_ssize_t i = first_after(p, off);
    if (n <= 0 || !covered(p, i, off, until < p->view_size ? until : p->view_size))
        return -1; /* (Python's: no check of the file made here for it) */
    if (!plan_holds(p)) {
        atomic_store(&p->dead, 1);
        return -1;
    }
    void *mem = NULL, *vec = NULL;
    if (posix_memalign(&mem, ALIGN, (size_t)n))
        return -1;
    made kin[MADE_MOST];
    int kins = 0, done = fill(p, i, mem, off, n, kin, &kins) == 0 && plan_holds(p) && (vec = bufvec(mem, (size_t)n));
    for (int j = 0; j < kins; j++) {
        if (done)
            accel_store_queue(p->fh, kin[j].offset, kin[j].mem, kin[j].size);
        else
            accel_store_give(kin[j].mem, kin[j].size);
    }
    if (!done) {
        free(mem);
        atomic_store(&p->dead, 1);
        return -1;
    }
    *bufp = vec;
    return 0;
}

static int read_gated(const char *path, void **bufp, size_t size, int64_t off, void *fi)
{
    uint64_t fh;
    memcpy(&fh, (char *)fi + gate.fh_offset, sizeof fh);
    plan *p = plan_take(fh);
    if (p) {
        int done = answer(p, bufp, size, off) == 0;
        plan_release(p);
        if (done) {
            atomic_fetch_add(&served, 1);
            return 0;
        }
    }
    return gate.fallback(path, bufp, size, off, fi);
}

PyObject *accel_read_gate(PyObject *self, PyObject *args)
{
    unsigned long long fallback;
    Py_ssize_t fh_offset, vsize, count_offset, size_offset, mem_offset;
    (void)self;
    if (!PyArg_ParseTuple(args, "Knnnnn", &fallback, &fh_offset, &vsize, &count_offset, &size_offset, &mem_offset))
        return NULL;
    if (!fallback || !accel_field_in(fh_offset, 40, sizeof(uint64_t)) || vsize < 0 || vsize > 4096
        || !accel_field_in(count_offset, vsize, sizeof(size_t)) || !accel_field_in(size_offset, vsize, sizeof(size_t))
        || !accel_field_in(mem_offset, vsize, sizeof(void *))) {
        PyErr_SetString(PyExc_ValueError, "read_gate: no fallback, or fields outside their structs");
        return NULL;
    }
    struct gate_settings want;
    memset(&want, 0, sizeof want);
    want.fallback = (highlevel_read_buf)(uintptr_t)fallback;
    want.fh_offset = fh_offset;
    want.vec_size = vsize;
    want.count_offset = count_offset;
    want.size_offset = size_offset;
    want.mem_offset = mem_offset;
    if (!accel_keep_once(&gate, &want, sizeof want, &gate_taken, "read_gate: another one gated"))
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)read_gated);
}

/* Whether rows segment s of the `count` at segs is sound, made ready:
 * rows of whole units (1 byte copied, 17 of MXFP4), `stride` apart, the
 * blob bytes of every row its output has addressable; where it names a kin
 * (`kin`: the view offset of the kin's output byte 0, -1 for none), that is
 * a whole segment of the same kind, rows and output size whose rows lie
 * within a span buffer with its own, and `kin` becomes its index.  Rows
 * end to end with no kin are made one run (rows of one unit). */
static int rows_sound(segment *segs, Py_ssize_t count, segment *s)
{
    int64_t unit = s->kind == ROWS ? 1 : MXFP4_BLOCK, rows;
    if (s->row <= 0 || s->row % unit || s->stride < s->row || (s->stride == s->row && s->kin >= 0))
        return 0;
    if (s->stride == s->row) {
        s->row = s->stride = unit;
        s->kin = -1;
    }
    rows = s->lo / s->row + s->size / s->row + 2;
    if (s->row > SPAN || s->lo > INT64_MAX - SPAN - s->size || rows > (INT64_MAX - s->origin - SPAN) / s->stride)
        return 0;
    if (s->kin < 0) {
        s->kin = -1;
        return 1;
    }
    Py_ssize_t lo = ending_after(segs, count, s->kin); /* (the kin, where a segment starts at its offset) */
    if (lo >= count || segs + lo == s)
        return 0;
    segment *k = &segs[lo];
    int64_t apart = k->origin > s->origin ? k->origin - s->origin : s->origin - k->origin;
    if (k->at != s->kin || k->lo != 0 || k->kind != s->kind || k->row != s->row || k->stride != s->stride
        || k->size != s->lo + s->size || apart > SPAN - s->row || rows > (INT64_MAX - k->origin - SPAN) / s->stride)
        return 0;
    s->kin = lo;
    return 1;
}

/* The segments of a plan, checked: in view order, none overlapping, each
 * of a known kind with no negative number and its bytes addressable (rows
 * segments `rows_sound`); NULL with ValueError otherwise. */
static segment *segments_of(Py_buffer *raw, Py_ssize_t *count)
{
    if (raw->len % (Py_ssize_t)sizeof(segment)) {
        PyErr_SetString(PyExc_ValueError, "read_plan: segments are not whole octuples of 64-bit numbers");
        return NULL;
    }
    *count = raw->len / (Py_ssize_t)sizeof(segment);
    segment *segs = malloc(raw->len ? (size_t)raw->len : 1);
    if (!segs) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(segs, raw->buf, (size_t)raw->len);
    int64_t end = 0;
    int bad = 0;
    for (Py_ssize_t i = 0; i < *count && !bad; i++) {
        segment *s = &segs[i];
        bad = s->at < end || s->size <= 0 || s->lo < 0 || s->kind < 0 || s->kind >= KINDS || s->origin < 0
              || s->at > INT64_MAX - s->size || s->lo > INT64_MAX - s->size - MXFP4_BLOCK;
        end = s->at + s->size;
    }
    for (Py_ssize_t i = 0; i < *count && !bad; i++) /* (once all are known sound on their own) */
        if (IS_ROWS(segs[i].kind))
            bad = !rows_sound(segs, *count, &segs[i]);
    if (bad) {
        free(segs);
        PyErr_SetString(PyExc_ValueError, "read_plan: segments out of order, overlapping, of no known kind, past any "
                                          "file, or rows or a kin not as they must be");
        return NULL;
    }
    return segs;
}

PyObject *accel_read_plan(PyObject *self, PyObject *args)
{
    unsigned long long fh, dev, ino, gen;
    int fd, watch_fd;
    long long lag, unit, size, mtime, ctime, view_size, window;
    int stores;
    Py_buffer raw, held;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiLL(KKLLL)iKy*y*LLp", &fh, &fd, &lag, &unit, &dev, &ino, &size, &mtime, &ctime,
                          &watch_fd, &gen, &raw, &held, &view_size, &window, &stores))
        return NULL;
    plan *p = calloc(1, sizeof *p);
    Py_ssize_t count = 0;
    segment *segs = p ? segments_of(&raw, &count) : NULL;
    uint8_t *kept = segs ? malloc(held.len ? (size_t)held.len : 1) : NULL;
    if (kept)
        memcpy(kept, held.buf, (size_t)held.len);
    int64_t held_size = held.len;
    PyBuffer_Release(&raw);
    PyBuffer_Release(&held);
    if (!p || !segs || !kept) {
        free(segs);
        free(p);
        return p && !segs ? NULL : PyErr_NoMemory();
    }
    int bad = fd < 0 || view_size < 0 || window < 0 || (lag != -1 && (lag < 0 || unit <= 0))
              || (count && segs[count - 1].at + segs[count - 1].size > view_size);
    for (Py_ssize_t i = 0; i < count && !bad; i++)
        bad = segs[i].kind == HELD_BYTES && segs[i].lo + segs[i].size > held_size;
    if (bad) {
        free(kept);
        free(segs);
        free(p);
        PyErr_SetString(PyExc_ValueError,
                        "read_plan: no descriptor, no way to drop behind, or segments past the view's end or the "
                        "held bytes");
        return NULL;
    }
    *p = (plan){.fh = fh, .fd = fd, .lag = lag, .unit = lag < 0 ? 1 : unit, .watch_fd = watch_fd, .dev = dev,
                .ino = ino, .size = size, .mtime = mtime, .ctime = ctime, .generation = gen, .view_size = view_size,
                .window = window, .stores = stores, .count = count, .segs = segs, .held = kept, .held_size = held_size};
    atomic_init(&p->refs, 1);
    atomic_init(&p->dead, 0);
    pthread_mutex_lock(&table_lock);
    plan *old = plan_unlink(fh);
    p->next = slots[fh % SLOTS];
    slots[fh % SLOTS] = p;
    pthread_mutex_unlock(&table_lock);
    if (old)
        plan_release(old);
    Py_RETURN_NONE;
}

PyObject *accel_read_forget(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    (void)self;
    if (!PyArg_ParseTuple(args, "K", &fh))
        return NULL;
    pthread_mutex_lock(&table_lock);
    plan *p = plan_unlink(fh);
    pthread_mutex_unlock(&table_lock);
    if (p)
        plan_release(p);
    Py_RETURN_NONE;
}

PyObject *accel_read_planned(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    (void)self;
    if (!PyArg_ParseTuple(args, "K", &fh))
        return NULL;
    plan *p = plan_take(fh);
    int alive = p && !atomic_load(&p->dead) && (p->watch_fd < 0 || atomic_load(&generation) == p->generation);
    if (p)
        plan_release(p);
    return PyBool_FromLong(alive);
}

PyObject *accel_read_events(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    atomic_fetch_add(&generation, 1);
    Py_RETURN_NONE;
}

PyObject *accel_read_generation(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&generation));
}

PyObject *accel_read_served(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&served));
}
