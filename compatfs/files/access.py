"""The permission decision the kernel makes, made for a FUSE caller on a file
the daemon holds open: the caller's uid and groups against the file's owner,
group and other bits and its POSIX access ACL (the `system.posix_acl_access`
extended attribute), as acl(5) orders them.

The same decision, made for every caller at once, says whether a store file
may go into something the mount shows to many (`everyone_who_may`): every
caller (but root) granted what one walk (`Recorder`) was asked, through
every folder on the way, must be granted what another was asked.

The ACL's binary layout (Linux's, little-endian): a 4-byte version (2), then
8-byte entries of a 2-byte tag, 2-byte permission bits (4 r, 2 w, 1 x) and a
4-byte uid or gid (unused for the owner, owning group, mask and other).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

READ, SEARCH = 4, 1

ACL_XATTR = "system.posix_acl_access"
_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_TAGS = {USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER}


class BadACL(ValueError):
    """An access ACL that is not in the documented layout."""


@dataclass(frozen=True)
class ACL:
    """A parsed access ACL: entries as (tag, id, permission bits)."""

    entries: tuple[tuple[int, int, int], ...]

    def perms(self, tag: int, absent: int = 0) -> int:
        """The bits of the first entry tagged `tag`; `absent` when there is
        none (0, nothing granted, unless the caller says otherwise)."""
        return next((p for t, _, p in self.entries if t == tag), absent)


def parse_acl(data: bytes) -> ACL:
    """The ACL in `data`; BadACL unless it is version 2, whole entries of known
    tags, and has exactly one owner, owning group and other entry (and a mask
    when it names users or groups), as the kernel itself requires."""
    if len(data) < 4 or (len(data) - 4) % 8:
        raise BadACL(f"{len(data)} bytes is not a header and whole entries")
    (version,) = struct.unpack_from("<I", data)
    if version != _VERSION:
        raise BadACL(f"version {version}, not {_VERSION}")
    entries = tuple((tag, ident, perm & 7) for tag, perm, ident in struct.iter_unpack("<HHI", data[4:]))
    tags = [t for t, _, _ in entries]
    if any(t not in _TAGS for t in tags):
        raise BadACL(f"unknown tag in {sorted(set(tags) - _TAGS)}")
    if any(tags.count(t) != 1 for t in (USER_OBJ, GROUP_OBJ, OTHER)) or tags.count(MASK) > 1:
        raise BadACL("not one owner, owning group and other entry")
    if (USER in tags or GROUP in tags) and MASK not in tags:
        raise BadACL("named entries without a mask")
    return ACL(entries)


def read_acl(path: str) -> ACL | None:
    """The access ACL of what `path` names (a /proc/self/fd link works for any
    descriptor, O_PATH ones included); None when it has none. BadACL when
    it cannot be read or parsed: the caller then refuses."""
    try:
        data = os.getxattr(path, ACL_XATTR)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise BadACL(f"cannot read: {e.strerror}") from None
    return parse_acl(data)


@dataclass
class Caller:
    """The process a FUSE request comes from: uid, primary gid and pid; its
    supplementary groups are read from /proc only when a decision needs them.
    They are unknown (None) where its pid is 0 (the daemon runs in another pid
    namespace than the caller's) or its /proc status cannot be read or is
    another's (its filesystem uid and gid are not the request's): then a
    decision that its groups could change is a refusal (`may`)."""

    uid: int
    gid: int
    pid: int
    _groups: frozenset[int] | None = field(default=None, repr=False)
    _read: bool = field(default=False, repr=False)

    @property
    def groups(self) -> frozenset[int] | None:
        """Its primary and supplementary groups; None when they cannot be known."""
        if not self._read:
            self._groups, self._read = _proc_groups(self.uid, self.gid, self.pid), True
        return self._groups

    def may(self, st: os.stat_result, acl: ACL | None, bit: int) -> bool:
        """Whether the kernel would grant permission `bit` (READ, SEARCH) on a
        file of status `st` and access ACL `acl`.  Root may read anything and
        search any folder (as CAP_DAC_OVERRIDE lets it).  With its groups
        unknown: granted only when every set of groups it could hold (its
        primary group, and any of the groups the file names) decides the same,
        and that is to grant."""
        if self.uid == 0:
            return True
        groups = self.groups
        if groups is not None:
            return _decide(self.uid, groups, st, acl, bit)
        named = sorted(({st.st_gid} | {i for t, i, _ in (acl.entries if acl else ()) if t == GROUP}) - {self.gid})
        if len(named) > _MAX_UNKNOWN_GROUPS:
            verdicts = {False}
        else:
            verdicts = {
                _decide(self.uid, frozenset({self.gid, *(g for j, g in enumerate(named) if k >> j & 1)}), st, acl, bit)
                for k in range(1 << len(named))
            }
        if len(verdicts) > 1:
            _log_unknown(self)
        return verdicts == {True}


# Groups a file names beyond which an unknown caller's membership is not
# tried out (2 ** this many sets): refused.
_MAX_UNKNOWN_GROUPS = 8
_logged_unknown: set[tuple[int, int]] = set()


def _log_unknown(caller: Caller) -> None:
    key = (caller.uid, caller.pid)
    if key not in _logged_unknown and len(_logged_unknown) < 1024:
        _logged_unknown.add(key)
        log.warning(
            "uid %d (pid %d as this daemon sees it): its supplementary groups cannot be read from /proc "
            "(a caller in another pid namespace than the daemon's?): refused where they would decide",
            caller.uid,
            caller.pid,
        )


def _proc_groups(uid: int, gid: int, pid: int) -> frozenset[int] | None:
    """The groups of process `pid` from /proc, when it is the caller (its
    filesystem uid and gid are `uid` and `gid`); None otherwise."""
    if pid <= 0:
        return None
    fields: dict[str, list[str]] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Uid", "Gid", "Groups"):
                    fields[key] = rest.split()
        if int(fields["Uid"][3]) != uid or int(fields["Gid"][3]) != gid:
            return None
        return frozenset({gid, *(int(g) for g in fields.get("Groups", []))})
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _decide(uid: int, groups: frozenset[int], st: os.stat_result, acl: ACL | None, bit: int) -> bool:
    """The kernel's decision for a caller other than root with `uid` and `groups`."""
    if acl is None:
        if uid == st.st_uid:
            return bool(st.st_mode >> 6 & bit)
        if st.st_gid in groups:
            return bool(st.st_mode >> 3 & bit)
        return bool(st.st_mode & bit)
    if uid == st.st_uid:
        return bool(acl.perms(USER_OBJ) & bit)
    mask = acl.perms(MASK, absent=7)
    named = [p for t, i, p in acl.entries if t == USER and i == uid]
    if named:
        return bool(named[0] & mask & bit)
    matching = [
        p for t, i, p in acl.entries if (t == GROUP_OBJ and st.st_gid in groups) or (t == GROUP and i in groups)
    ]
    if matching:
        return any(p & mask & bit for p in matching)
    return bool(acl.perms(OTHER) & bit)


Chain = list[tuple[os.stat_result, "ACL | None", int]]


@dataclass
class Recorder(Caller):
    """A caller granted everything, which keeps each decision it was asked
    for (the status and ACL of each folder a walk searched and of the file
    it read, in order): what one walk takes, for `everyone_who_may`."""

    uid: int = -1
    gid: int = -1
    pid: int = -1
    chain: Chain = field(default_factory=list)

    def may(self, st: os.stat_result, acl: ACL | None, bit: int) -> bool:
        self.chain.append((st, acl, bit))
        return True


def everyone_who_may(gate: Chain, then: Chain) -> bool:
    """Whether every caller but root that the kernel grants all of `gate`
    (the decisions a `Recorder` kept) it also grants all of `then`: tried for
    every uid the two name (owners, named ACL users) and one they do not,
    each with every set of the groups they name (owning groups, named ACL
    groups); more than `_MAX_UNKNOWN_GROUPS` groups: False."""
    uids: set[int] = set()
    gids: set[int] = set()
    for st, acl, _ in (*gate, *then):
        uids.add(st.st_uid)
        gids.add(st.st_gid)
        for tag, ident, _ in acl.entries if acl is not None else ():
            (uids if tag == USER else gids if tag == GROUP else set()).add(ident)
    uids.discard(0)
    uids.add(max(uids, default=0) + 1)  # a user none of them names
    named = sorted(gids)
    if len(named) > _MAX_UNKNOWN_GROUPS:
        return False
    for uid in uids:
        for k in range(1 << len(named)):
            groups = frozenset(g for j, g in enumerate(named) if k >> j & 1)
            if all(_decide(uid, groups, *d) for d in gate) and not all(_decide(uid, groups, *d) for d in then):
                return False
    return True
