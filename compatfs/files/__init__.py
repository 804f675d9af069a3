"""Files on disk, read one way: `blobfile` opens and reads every store file
(the path walk, non-blocking, identity-checked), `access` decides permission
on it, `libc` (malloc, cachestat), `scratch` the buffers a read borrows,
`watch` inotify, `mounttable` /proc/self/mountinfo, `statedir` the per-user
state folder."""
