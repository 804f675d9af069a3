/* compatfs._accel: optional compiled kernels, each giving the same bytes as
 * its numpy counterpart (the tests compare the two).  Built by setup.py where
 * a C compiler is at hand; compatfs.translate.accel falls back to numpy
 * without it.  Its functions, one file a job: repack.c (mxfp4_repack),
 * gather.c (gather_read), folders.c (keep_opendir, opendir_gate,
 * dir_handle, readdir_gate, listed), listings.c (listings_put,
 * listings_generation, listings_has, listings_served), polling.c
 * (polling_io, polled), readgate.c (read_gate, read_plan, read_forget,
 * read_planned, read_events, read_generation, read_served), stores.c
 * (read_stores_wake, read_stores, read_store_free, read_stores_refused),
 * ending.c (notices_hold, notices_release, notices_begin, notices_end). */
#include "accel.h"

static PyMethodDef methods[] = {
    {"mxfp4_repack", accel_mxfp4_repack, METH_VARARGS,
     "mxfp4_repack(dst, src, width, stride, first, count): MXFP4 blocks first .. first + count - 1 of src "
     "(rows of width blocks, stride bytes apart) from the checkpoint's nibble order into ggml's, into dst."},
    {"gather_read", accel_gather_read, METH_VARARGS,
     "gather_read(fd, dst, offset, unit, stride, count, period): count runs of unit bytes of file fd, run i at "
     "offset + i * stride, read into dst at i * period in one pass over the file; the bytes of the span read."},
    {"keep_opendir", accel_keep_opendir, METH_VARARGS,
     "keep_opendir(original, offset, mask): the address of a libfuse low-level opendir that sets mask in the "
     "32-bit word offset bytes into the request's fuse_file_info, then calls original."},
    {"opendir_gate", accel_opendir_gate, METH_VARARGS,
     "opendir_gate(fallback, context, uid_offset, fh_offset, offset, mask): the address of a libfuse high-level "
     "opendir that answers root's opens itself (fh a dir_handle, mask set in the word offset bytes into "
     "fuse_file_info) and passes every other to fallback."},
    {"dir_handle", accel_dir_handle, METH_NOARGS, "dir_handle(): a folder's fh no other open of a folder has (never 0)."},
    {"listed", accel_listed, METH_VARARGS,
     "listed(fh, count): the folder open as fh was listed to its end, count entries (one call per listing: "
     "readdir_gate answers a later request for it from an offset at or past count with nothing)."},
    {"readdir_gate", accel_readdir_gate, METH_VARARGS,
     "readdir_gate(fallback, fh_offset, stat_size, plus): the address of a libfuse 3 high-level readdir that answers "
     "a request from an offset at or past the count `listed` gave for the fh (the 64-bit word fh_offset bytes into "
     "fuse_file_info) with nothing, one with the flag plus for a folder listings_put kept from what is kept, and "
     "passes every other one to fallback."},
    {"listings_put", accel_listings_put, METH_VARARGS,
     "listings_put(path, generation, entries): keep the listing of the folder at path, entries (name, st, fill), "
     "under generation (the current one); whether kept."},
    {"listings_generation", accel_listings_generation, METH_VARARGS,
     "listings_generation(generation): listings kept under another generation are answered from no more."},
    {"listings_has", accel_listings_has, METH_VARARGS,
     "listings_has(path, generation): whether the folder's listing is kept under generation."},
    {"listings_served", accel_listings_served, METH_NOARGS,
     "listings_served(): the listings the readdir gate answered from those kept so far."},
    {"polling_io", accel_polling_io, METH_VARARGS,
     "polling_io(spin_ns, watch_ns, releasedir_in_c): the address of a libfuse 3 fuse_custom_io whose read lets one "
     "worker at a time read the device while a listing goes on, the one that answered a request in C polling up to "
     "spin_ns first; an answer in Python that takes longer than watch_ns ends it."},
    {"polled", accel_polled, METH_NOARGS, "polled(): the requests found by a polling worker so far."},
    {"read_gate", accel_read_gate, METH_VARARGS,
     "read_gate(fallback, fh_offset, vec_size, count_offset, size_offset, mem_offset): the address of a libfuse 3 "
     "high-level read_buf that answers a read of an open file's plain ranges from its plan (read_plan) and passes "
     "every other read to fallback."},
    {"read_plan", accel_read_plan, METH_VARARGS,
     "read_plan(fh, fd, direct_fd, identity, watch_fd, generation, segments, held, view_size, window, direct_min): "
     "the plan read_gate answers open file fh's reads from (its own duplicates of the descriptors)."},
    {"read_forget", accel_read_forget, METH_VARARGS, "read_forget(fh): the plan of fh gone."},
    {"read_planned", accel_read_planned, METH_VARARGS, "read_planned(fh): whether fh has a plan still alive."},
    {"read_events", accel_read_events, METH_NOARGS, "read_events(): a batch of inotify events is about to be read."},
    {"read_generation", accel_read_generation, METH_NOARGS, "read_generation(): the batches of events so far."},
    {"read_served", accel_read_served, METH_NOARGS, "read_served(): the reads read_gate answered so far."},
    {"read_stores_wake", accel_read_stores_wake, METH_VARARGS,
     "read_stores_wake(fd, limit): kin pages made while at most limit bytes are queued, eventfd fd written to as "
     "the queue fills (fd -1: none made)."},
    {"read_stores", accel_read_stores, METH_NOARGS, "read_stores(): the kin pages queued, taken: (fh, offset, mem, size)."},
    {"read_store_free", accel_read_store_free, METH_VARARGS, "read_store_free(mem, size): a store's memory given back."},
    {"read_stores_refused", accel_read_stores_refused, METH_NOARGS,
     "read_stores_refused(): kin ranges not made so far (the queue full)."},
    {"notices_hold", accel_notices_hold, METH_NOARGS,
     "notices_hold(): whether the FUSE session goes on, held until notices_release() where it does."},
    {"notices_release", accel_notices_release, METH_NOARGS, "notices_release(): a hold of notices_hold() let go."},
    {"notices_begin", accel_notices_begin, METH_NOARGS, "notices_begin(): a FUSE session begins."},
    {"notices_end", accel_notices_end, METH_NOARGS, "notices_end(): the FUSE session ends, once no hold is left."},
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
