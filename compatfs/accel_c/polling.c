/* polling_io(spin_ns, watch_ns, releasedir_in_c): the address of a libfuse 3
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
 * loop's end) passes the turn on.  A read that finds the connection ended
 * tells ending.c (no path is invalidated from then on).  What compatfs.fuse.polling hands
 * fuse_session_custom_io, where the loop's workers run until it ends.
 * One setting per process; ValueError for another (or OSError where the
 * watch cannot be set up).
 *
 * polled(): how many requests a worker found while polling so far. */
#include "accel.h"

#include <errno.h>
#include <string.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

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
           || (head->opcode == FUSE_OPENDIR && head->uid == 0 && accel_root_opens_gated()) || head->opcode == FUSE_FORGET
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

/* Whether this worker still has the turn it took: not where the watch has
 * ended listing mode since (a new epoch). */
static int has_turn(void)
{
    if (holding && held_epoch != atomic_load(&turn_epoch))
        holding = 0;
    return holding;
}

/* Under turn_lock: this worker gives up the turn it has (to one waiting worker). */
static void pass_turn(void)
{
    if (has_turn()) {
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
    if (quick) {
        if (has_turn() || !turn_taken) {
            atomic_store(&listing_mode, 1);
            turn_taken = holding = 1;
            held_epoch = atomic_load(&turn_epoch);
        }
        return;
    }
    if (listing && has_turn()) {
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
    return has_turn();
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
    if (n < 0 && err == ENODEV) /* (the connection ended: the session's end is under way) */
        accel_session_ended();
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

PyObject *accel_polling_io(PyObject *self, PyObject *args)
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

PyObject *accel_polled(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&polled_total));
}
