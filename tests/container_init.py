"""What runc does between the kubelet's CRI request and the container's first instruction,
as far as this machine allows (no runc, no crun: they cannot start containers here), for
the pod journey of tests/test_deploy_pod_journey.py. Standard library only: it runs with
the test's interpreter outside the image, then replaces itself with the image's program.

``python tests/container_init.py sandbox SPEC.json`` runs under ``unshare --net --uts
--ipc``: the pod's sandbox (containerd's RunPodSandbox with its pause container), whose
network namespace a CNI plugin has set up: the loopback interface up, with the pod's IP
beside 127.0.0.1 (the kubelet probes and Prometheus scrapes the pod's IP), the pod's
hostname; then it sleeps, as pause does, holding the namespaces for the containers.

``python tests/container_init.py run SPEC.json`` runs under ``unshare --mount [--pid]
--fork --propagation private`` and does what runc's libcontainer does for the OCI spec
containerd writes (containerd internal/cri/server/container_create.go, buildLinuxSpec;
runc libcontainer/rootfs_linux.go and init_linux.go): it joins the sandbox's network, UTS
and IPC namespaces, mounts in order (binds, read-only where the spec says; a fresh
``proc`` of the container's PID namespace, ``/dev`` as a tmpfs with the standard devices,
``sysfs`` read-only), makes the root filesystem read-only where the spec says, ``chroot``s
into the image's root and takes the process's identity: the capability bounding set cut
to the spec's set, inheritable and ambient capabilities cleared, the supplementary
groups, gid, uid, ``no_new_privs``; then ``execve`` of the spec's argv with its
environment, so that the image's program is pid 1 of its PID namespace, as in a pod.

``python tests/container_init.py exec SPEC.json`` is ``kubectl exec``: containerd's exec
(internal/cri/server/container_execsync.go) runs a new process with the container's
process spec (environment, user, capabilities, ``no_new_privs``, working directory) and
only the argv replaced (``TERM=xterm`` added with a terminal), in the container's
namespaces and root, as runc exec does (setns, then a fork for the PID namespace).

Not modelled: seccomp (RuntimeDefault), AppArmor/SELinux, cgroups (resources), user
namespaces, mount propagation (every mount is private here), masked and read-only
/proc paths.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys
from typing import Any

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_STRICTATIME = 32, 4096, 16384, 1 << 24
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
NAMESPACES = {"ipc": 0x08000000, "uts": 0x04000000, "net": 0x40000000, "pid": 0x20000000,
              "mnt": 0x00020000}
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, SIOCSIFNETMASK = 0x8913, 0x8914, 0x8916, 0x891C
IFF_UP = 0x1
CAPS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
        "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9,
        "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13,
        "IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18,
        "SYS_PTRACE": 19, "SYS_PACCT": 20, "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23,
        "SYS_RESOURCE": 24, "SYS_TIME": 25, "SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28,
        "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30, "SETFCAP": 31, "MAC_OVERRIDE": 32,
        "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35, "BLOCK_SUSPEND": 36,
        "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                      flags, data.encode() or None), f"mount {source} on {target}")


def bind(source: str, target: str, read_only: bool) -> None:
    """A bind mount, recursive, as runc does for a "bind"/"rbind" mount of the spec; then,
    for "ro", the remount that makes this mount (not the ones under it) read-only."""
    if not os.path.lexists(target):
        if os.path.isdir(source):
            os.makedirs(target)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        mount("", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def standard_mounts(root: str) -> None:
    """The mounts of containerd's default spec (oci.populateDefaultUnixSpec) that runc sets
    up: proc, a tmpfs /dev with the standard device nodes (bound from the host here, as
    runc does in a user namespace), devpts, shm, and sysfs read-only."""
    os.makedirs(f"{root}/proc", exist_ok=True)
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV)
    os.makedirs(f"{root}/dev", exist_ok=True)
    mount("tmpfs", f"{root}/dev", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k")
    for name in DEVICES:
        bind(f"/dev/{name}", f"{root}/dev/{name}", read_only=False)
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                     ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                     ("ptmx", "pts/ptmx")):
        os.symlink(to, f"{root}/dev/{link}")
    os.makedirs(f"{root}/dev/pts")
    mount("devpts", f"{root}/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=0620")
    os.makedirs(f"{root}/dev/shm")
    mount("shm", f"{root}/dev/shm", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV,
          "mode=1777,size=65536k")
    os.makedirs(f"{root}/sys", exist_ok=True)
    mount("sysfs", f"{root}/sys", "sysfs", MS_NOSUID | MS_NOEXEC | MS_NODEV | MS_RDONLY)


def _ifreq(name: str, payload: bytes = b"") -> bytes:
    return struct.pack("16s", name.encode()) + payload.ljust(24, b"\0")


def network(pod_ip: str) -> None:
    """The pod's network namespace as a CNI plugin leaves it, reduced to one device: the
    loopback interface up, with the pod's IP beside 127.0.0.1 (the kubelet probes and
    Prometheus scrapes the pod's IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, _ifreq("lo"))[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, _ifreq("lo", struct.pack("H", flags | IFF_UP)))
        addr = struct.pack("HH4s", socket.AF_INET, 0, socket.inet_aton(pod_ip))
        mask = struct.pack("HH4s", socket.AF_INET, 0, socket.inet_aton("255.255.255.255"))
        fcntl.ioctl(s, SIOCSIFADDR, _ifreq("lo:pod", addr))
        fcntl.ioctl(s, SIOCSIFNETMASK, _ifreq("lo:pod", mask))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def identity(spec: dict[str, Any]) -> None:
    """The process's user and capabilities (runc's finalizeNamespace): the bounding set
    cut to the spec's capabilities, inheritable and ambient cleared, then setgroups,
    setgid, setuid (a uid other than 0 loses every capability here), no_new_privs. At
    execve a root process gets the bounding set as its permitted and effective sets."""
    keep = {CAPS[c] for c in spec["capabilities"]}
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in keep:
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
    _check(libc.capset(ctypes.byref(header), data), "capset")
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    if spec["no_new_privs"]:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def sandbox(spec: dict[str, Any]) -> None:
    socket.sethostname(spec["hostname"])
    network(spec["pod_ip"])
    os.execvp("sleep", ["sleep", "infinity"])


def join(pid: int, namespaces: list[str]) -> None:
    fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in namespaces}
    for ns, fd in fds.items():
        _check(libc.setns(fd, NAMESPACES[ns]), f"setns {ns}")
        os.close(fd)


def run(spec: dict[str, Any]) -> None:
    join(spec["sandbox_pid"], ["net", "uts", "ipc"])
    root = spec["rootfs"]
    for m in spec["mounts"]:  # volumes, /etc/hosts, /etc/hostname, /dev/termination-log
        if m["destination"] in ("/proc", "/dev", "/sys"):
            raise ValueError(f"{m['destination']}: a mount over a standard one")
    standard_mounts(root)
    for m in spec["mounts"]:
        bind(m["source"], root + m["destination"], m["read_only"])
    if spec["read_only_rootfs"]:
        mount("", root, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    os.chroot(root)
    os.chdir(spec["cwd"])
    identity(spec)
    os.execvpe(spec["argv"][0], spec["argv"], dict(e.split("=", 1) for e in spec["env"]))


def exec_in(spec: dict[str, Any]) -> None:
    pid = spec["target_pid"]
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    join(pid, [ns for ns in NAMESPACES if spec["pid_namespace"] or ns != "pid"])
    os.fchdir(root)
    os.chroot(".")
    os.chdir(spec["cwd"])
    identity(spec)
    env = dict(e.split("=", 1) for e in spec["env"])
    child = os.fork()  # into the PID namespace entered above
    if child == 0:
        try:
            os.execvpe(spec["argv"][0], spec["argv"], env)
        finally:
            os._exit(127)
    status = os.waitpid(child, 0)[1]
    os._exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        loaded = json.load(f)
    {"sandbox": sandbox, "run": run, "exec": exec_in}[mode](loaded)
