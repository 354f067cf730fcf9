"""The kernel sandbox around a sealed agent's worker process (Linux).

A sealed agent's worker (:mod:`diloco_gym.eval.sealed`) is a fresh interpreter that holds
the agents and nothing of the evaluation. This module closes what a separate process alone
leaves open: the evaluator's ``/proc`` entries (its command line, environment and memory),
the files on disk (trace files, output directories, the working directory), the network
and the evaluator's signals. It uses the kernel's own mechanisms, called through the
standard library (``ctypes`` on the C library's ``unshare``, ``prctl`` and ``syscall``):

* **Landlock** (Linux 5.13+): the worker may read only the Python installation, the
  package's own code and a few system files (shared libraries, ``/dev/null``, its own
  ``/proc`` entry), and write only to a private temporary directory. Every other path is
  refused by the kernel, whatever the file permissions say. From Landlock ABI 4 it also
  refuses TCP bind and connect, and from ABI 6 signals to, and abstract UNIX sockets of,
  processes outside the sandbox (the evaluator among them). Landlock also refuses
  ``ptrace`` access (and so ``/proc/PID/mem``) to processes outside the sandbox.
* **Namespaces**: a new network namespace (no interface but a loopback that is down),
  and for a worker started as root either an unprivileged uid (``nobody``, where the
  Python installation is readable by it) or a new user namespace, in which the worker
  holds no capability of the machine's own namespace.
* ``PR_SET_NO_NEW_PRIVS`` in the worker and ``PR_SET_DUMPABLE`` off in the evaluator:
  the evaluator's memory and ``/proc`` files are closed to processes without
  ``CAP_SYS_PTRACE`` even if another layer failed.

The mechanisms are applied in the worker before any agent code runs (the agents'
pickled bytes are loaded afterwards, inside the sandbox). :func:`enter` returns a bit
mask of what took effect; :func:`describe` turns it into the sealing level reports state:
``full`` when the filesystem, network and privilege layers all took effect, ``partial``
when some did, ``process`` when none did (another platform, or a kernel without them):
then only the separate process and its fixed answer format protect the evaluator.

The ``landlock`` package on PyPI is a pre-release binding; the few structures used here
are the kernel's stable ABI (``include/uapi/linux/landlock.h``), written out below.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "FULL",
    "PARTIAL",
    "PROCESS",
    "Mechanism",
    "plan",
    "enter",
    "describe",
    "make_evaluator_undumpable",
]

FULL, PARTIAL, PROCESS = "full", "partial", "process"


class Mechanism:
    """Bits of the mask :func:`enter` returns (one per mechanism that took effect)."""

    NO_NEW_PRIVS = 1 << 0
    USER_NS = 1 << 1  # a new user namespace: no capability in the machine's own
    UID_DROPPED = 1 << 2  # started as root, now running as nobody
    UNPRIVILEGED = 1 << 3  # started without any privilege to drop (not root)
    NET_NS = 1 << 4  # a new network namespace: no interface that is up
    LANDLOCK_FS = 1 << 5  # reads and writes confined to the allowed paths
    LANDLOCK_NET = 1 << 6  # TCP bind and connect refused
    LANDLOCK_SCOPE = 1 << 7  # signals and abstract UNIX sockets kept inside
    EVALUATOR_UNDUMPABLE = 1 << 8  # set by the parent, not the worker

    NAMES = {
        NO_NEW_PRIVS: "no_new_privs",
        USER_NS: "user namespace",
        UID_DROPPED: "uid nobody",
        UNPRIVILEGED: "unprivileged uid",
        NET_NS: "network namespace",
        LANDLOCK_FS: "landlock filesystem",
        LANDLOCK_NET: "landlock tcp",
        LANDLOCK_SCOPE: "landlock scopes",
        EVALUATOR_UNDUMPABLE: "evaluator not dumpable",
    }


# --- the kernel's constants -----------------------------------------------------------
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
# landlock_create_ruleset / add_rule / restrict_self: one number on every architecture
_SYS_CREATE, _SYS_ADD, _SYS_RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
# LANDLOCK_ACCESS_FS_*: the rights of files and directories, by the ABI that added them
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
_NOBODY = 65534


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def make_evaluator_undumpable() -> bool:
    """``PR_SET_DUMPABLE`` off in this (the evaluating) process, so that its memory,
    environment and ``/proc`` files are closed to processes without ``CAP_SYS_PTRACE``
    (its sealed workers among them). Returns whether it took effect (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _python_paths() -> list[str]:
    """The directories the interpreter reads its own code and libraries from."""
    import site
    import sysconfig

    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    paths.update(p for p in sysconfig.get_paths().values())
    try:
        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - a virtualenv's old site module
        pass
    return sorted(paths)


def _package_paths() -> list[str]:
    """The package's own code: ``diloco_gym`` and its agents (a symbolic link in a source
    checkout, so both resolved)."""
    import diloco_gym
    import diloco_gym.agents

    return [
        str(Path(diloco_gym.__file__).resolve().parent),
        str(Path(diloco_gym.agents.__file__).resolve().parent),
    ]


#: System paths a worker reads: shared libraries, the dynamic loader's cache, time zones.
_SYSTEM_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/sys/devices/system/cpu",
)


def readable_roots() -> list[str]:
    """Every path a sandboxed worker may read (resolved; those that exist)."""
    out: list[str] = []
    for p in (*_python_paths(), *_package_paths(), *_SYSTEM_PATHS):
        try:
            r = str(Path(p).resolve())
        except (OSError, RuntimeError):
            continue
        if os.path.exists(r) and r not in out:
            out.append(r)
    return out


def _nobody_can_read(paths: list[str]) -> bool:
    """Whether the uid ``nobody`` could traverse to and read each of ``paths`` (the
    world's permission bits on every directory above it), so that a root worker may drop
    to it and still import its code."""
    import stat

    for p in paths:
        at = Path(p)
        for d in [at, *at.parents]:
            try:
                mode = os.stat(d).st_mode
            except OSError:
                return False
            need = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
            if not mode & need:
                return False
    return True


def plan(private_dir: str) -> dict[str, Any]:
    """What the parent tells a worker to confine itself to: the readable roots, its one
    writable directory, and whether a root worker can drop to ``nobody``."""
    roots = readable_roots()
    return {
        "read": roots,
        "write": [private_dir],
        "drop_uid": _nobody_can_read([*roots, private_dir]),
    }


def _landlock(libc: Any, read: list[str], write: list[str], pid: int) -> int:
    """Restrict this process with Landlock; the mask of what took effect."""
    abi = libc.syscall(_SYS_CREATE, None, 0, _CREATE_RULESET_VERSION)
    if abi < 1:
        return 0
    fs = _FS_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    fs |= _FS_IOCTL_DEV if abi >= 5 else 0
    attr = _RulesetAttr(fs, _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0, 0)
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(_SYS_CREATE, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return 0
    ro = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    try:
        for paths, rights in ((read, ro), (write, fs)):
            for p in [*paths, *([f"/proc/{pid}"] if rights == ro else [])]:
                try:
                    fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    allowed = rights if os.path.isdir(p) else rights & _FILE_RIGHTS
                    rule = _PathBeneathAttr(allowed & fs, fd)
                    if libc.syscall(_SYS_ADD, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                        return 0
                finally:
                    os.close(fd)
        if libc.syscall(_SYS_RESTRICT, ruleset, 0):
            return 0
    finally:
        os.close(ruleset)
    mask = Mechanism.LANDLOCK_FS
    mask |= Mechanism.LANDLOCK_NET if abi >= 4 else 0
    mask |= Mechanism.LANDLOCK_SCOPE if abi >= 6 else 0
    return mask


def _drop_root(libc: Any, drop_uid: bool) -> int:
    """A root worker gives up its privileges: to ``nobody`` where it can still read its
    code, else into a new user namespace (no capability in the machine's namespace)."""
    if drop_uid:
        try:
            os.setgroups([])
            os.setresgid(_NOBODY, _NOBODY, _NOBODY)
            os.setresuid(_NOBODY, _NOBODY, _NOBODY)
            return Mechanism.UID_DROPPED
        except OSError:
            pass
    return Mechanism.USER_NS if libc.unshare(_CLONE_NEWUSER) == 0 else 0


def enter(the_plan: dict[str, Any]) -> int:
    """Confine this process (a worker, before any agent code runs) as ``the_plan`` says;
    returns the :class:`Mechanism` mask of what took effect. Never raises: what the
    kernel refuses is simply not in the mask (the parent decides whether that is enough).
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = _libc()
    except OSError:  # pragma: no cover - no C library to call
        return 0
    mask = 0
    root = os.geteuid() == 0
    if root:
        mask |= Mechanism.NET_NS if libc.unshare(_CLONE_NEWNET) == 0 else 0
    elif libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        mask |= Mechanism.USER_NS | Mechanism.NET_NS | Mechanism.UNPRIVILEGED
    else:
        mask |= Mechanism.UNPRIVILEGED
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        mask |= Mechanism.NO_NEW_PRIVS
        mask |= _landlock(libc, the_plan["read"], the_plan["write"], os.getpid())
    if root:
        mask |= _drop_root(libc, bool(the_plan.get("drop_uid")))
    # end with the evaluator (a uid change clears the parent-death signal: set it last)
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    return mask


#: What ``full`` needs: each group's mechanisms, any one of which suffices.
_FULL_NEEDS = {
    "filesystem": Mechanism.LANDLOCK_FS,
    "network": Mechanism.NET_NS | Mechanism.LANDLOCK_NET,
    "privileges": Mechanism.USER_NS | Mechanism.UID_DROPPED | Mechanism.UNPRIVILEGED,
    "evaluator memory": Mechanism.EVALUATOR_UNDUMPABLE,
}


def describe(mask: int) -> dict[str, Any]:
    """The sealing level of a worker whose mechanisms are ``mask``: ``{"level", "mechanisms",
    "missing", "platform"}`` (``missing``: the layers of ``full`` that did not take
    effect)."""
    missing = [layer for layer, bits in _FULL_NEEDS.items() if not mask & bits]
    real = mask & ~Mechanism.UNPRIVILEGED & ~Mechanism.EVALUATOR_UNDUMPABLE
    level = FULL if not missing else PARTIAL if real else PROCESS
    return {
        "level": level,
        "mechanisms": [name for bit, name in Mechanism.NAMES.items() if mask & bit],
        "missing": missing,
        "platform": f"{sys.platform} {os.uname().release}" if hasattr(os, "uname") else "",
    }
