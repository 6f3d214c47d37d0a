"""Sandbox launcher: a throwaway process that walls in one program, then runs the harness.

Run as a script (`python -I -S _launcher.py`), never imported by the trainer: it calls
unshare(2), mount(2) and setuid(2), which must not touch the trainer's own process. It reads
one JSON job on stdin and, as far as the OS allows:

1. unshares network, PID and mount namespaces (root), or the same inside a new user
   namespace (unprivileged users); what it got is written first to the result pipe as
   `iso {...}` so the parent knows (and can warn when isolation is weaker);
2. forks the namespace's init (C). C makes every mount read-only *per mount point*
   (MS_BIND|MS_REMOUNT, which never changes the host's filesystems), puts a size-capped tmpfs
   on the working directory, mounts a fresh /proc and hides home directories; writes the
   harness and its job into the working directory; sets rlimits (address space, CPU, file
   size, processes, open files, no core dumps); drops to an unprivileged uid (root ignores
   RLIMIT_NPROC, so without this a fork bomb is unbounded) with no_new_privs; then forks the
   harness (P) and waits for it. When C exits the kernel kills everything left in the PID
   namespace, daemonised children included.
3. Without a PID namespace the launcher sweeps leftovers itself: as the sandbox's own uid,
   kill(-1, SIGKILL) reaches exactly that uid's processes (only when the uid is unique).

Exit status: the harness's exit code, or 128 + signal number when it was killed.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38

libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> bool:
    return libc.unshare(flags) == 0


def _mount(source, target, fstype, flags, data=None) -> bool:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    return libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(outer_uid: int, outer_gid: int, want_net: bool = True) -> dict:
    """Unshare as much as allowed; returns which namespaces this process is now in."""
    net_pid_mnt = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS
    attempts = [net_pid_mnt, CLONE_NEWUSER | net_pid_mnt, CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET]
    if not want_net:  # tests exercise the socket-level fallback this way
        attempts = [f & ~CLONE_NEWNET for f in attempts]
    for flags in attempts:
        if flags & CLONE_NEWUSER and outer_uid == 0:
            continue  # root needs no user namespace, and would lose the uid drop inside one
        if _unshare(flags):
            if flags & CLONE_NEWUSER:  # become "root" of the new namespace, mapped to ourselves
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"0 {outer_uid} 1")
                _write("/proc/self/gid_map", f"0 {outer_gid} 1")
            return {
                "netns": bool(flags & CLONE_NEWNET),
                "pidns": bool(flags & CLONE_NEWPID),
                "mountns": bool(flags & CLONE_NEWNS),
                "userns": bool(flags & CLONE_NEWUSER),
            }
    return {"netns": False, "pidns": False, "mountns": False, "userns": False}


def lock_filesystem(workdir: str, disk_mb: int, hide: list[str]) -> bool:
    """Inside a private mount namespace: everything read-only, a fresh tmpfs as the workdir."""
    if not _mount(None, "/", None, MS_REC | MS_PRIVATE):
        return False  # never remount anything that could propagate back to the host
    with open("/proc/self/mountinfo") as f:
        mounts = [(fields[4].encode().decode("unicode_escape"), fields[5].split(",")) for fields in map(str.split, f)]
    for point, options in mounts:
        # MS_BIND|MS_REMOUNT changes this namespace's mount point only, never the filesystem.
        # Keep nodev/noexec as they were: /dev must keep working (/dev/null), and a user
        # namespace may not clear them anyway.
        kept = (MS_NODEV if "nodev" in options else 0) | (MS_NOEXEC if "noexec" in options else 0)
        _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)
    if os.path.isdir("/dev/shm"):  # multiprocessing needs a writable /dev/shm: a small private one
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777")
    for path in hide:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
    ok = _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # hide the host's processes
    return ok


def expose_interpreter(job: dict) -> str:
    """Bind the interpreter's installation (and virtualenv) read-only into the workdir.

    The unprivileged uid often cannot reach the interpreter where it lives (pyenv under a
    0700 /root, a venv in someone's home). Returns the path to exec, and fills
    job["harness_job"]["sys_path"] with the virtualenv's site-packages as seen from inside.
    """
    py = job["interpreter"]
    if not py:
        return job["python"]
    runtime = os.path.join(job["workdir"], ".runtime")
    targets = {"base": py["base"], "venv": py["venv"]} if py["venv"] else {"base": py["base"]}
    for name, source in targets.items():
        point = os.path.join(runtime, name)
        os.makedirs(point, mode=0o755, exist_ok=True)
        if not (
            _mount(source, point, None, MS_BIND | MS_REC)
            and _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        ):
            return job["python"]
    os.chmod(runtime, 0o755)
    job["harness_job"]["sys_path"] = [os.path.join(runtime, "venv", rel) for rel in py["site_rel"]]
    return os.path.join(runtime, "base", py["exe_rel"])


def set_limits(lim: dict, nproc_base: int) -> None:
    mb = 1024 * 1024
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory_mb"] * mb, lim["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_mb"] * mb, lim["file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc_base + lim["max_procs"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_files"], lim["max_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def drop_privileges(uid: int, gid: int) -> None:
    """Switch to the sandbox uid for good (the parent chose one that is mapped here)."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def count_processes_of(uid: int) -> int:
    """Processes already charged to `uid` (RLIMIT_NPROC counts them all, not just ours)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += os.stat(f"/proc/{pid}").st_uid == uid
            except OSError:
                pass
    return n


def sweep_uid(uid: int) -> None:
    """Kill every process of the (unique) sandbox uid; the forked sweeper itself is spared."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setuid(uid)
            for _ in range(3):
                os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def exit_like(status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def run_init(job: dict, iso: dict, result_fd: int) -> None:
    """The sandbox's init: prepare the filesystem, limits and uid, run the harness, wait."""
    workdir = job["workdir"]
    if iso["mountns"]:
        iso["fs_locked"] = lock_filesystem(workdir, job["limits"]["disk_mb"], job["hide"])
    uid = job["uid"] if iso["uid_drop"] else None
    python = expose_interpreter(job) if uid is not None and iso.get("fs_locked") else job["python"]
    for name, text in (("harness.py", job["harness_source"]), ("job.json", json.dumps(job["harness_job"]))):
        path = os.path.join(workdir, name)
        _write(path, text)
        os.chmod(path, 0o600)
        if uid is not None:
            os.chown(path, uid, job["gid"])
    if uid is not None:
        os.chown(workdir, uid, job["gid"])
    os.chmod(workdir, 0o700)
    set_limits(job["limits"], 0 if uid is not None else job["nproc_base"])
    if uid is not None:
        drop_privileges(uid, job["gid"])
    os.write(result_fd, ("fs " + json.dumps({"fs_locked": iso.get("fs_locked", False)}) + "\n").encode())
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    child = os.fork()
    if child == 0:
        try:
            os.chdir(workdir)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
            os.execve(python, [python, "-I", "harness.py", "job.json", str(result_fd)], env)
        except BaseException as e:
            os.write(2, f"sandbox: cannot start the harness: {e!r}\n".encode())
        finally:
            os._exit(127)
    os.close(result_fd)
    _, status = os.waitpid(child, 0)
    if not iso["pidns"] and uid is not None and job["uid_unique"]:
        for _ in range(3):  # our own uid: kill(-1) reaches only this sandbox's leftovers
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                break
    exit_like(status)


def main() -> None:
    job = json.loads(sys.stdin.read())
    result_fd = job["result_fd"]
    root = os.geteuid() == 0
    job["nproc_base"] = 0 if root else count_processes_of(os.getuid())  # host view, before unshare
    iso = enter_namespaces(os.getuid(), os.getgid(), job.get("network_namespace", True))
    iso["uid_drop"] = job["uid"] is not None and root and not iso["userns"]
    os.write(result_fd, ("iso " + json.dumps(iso) + "\n").encode())
    job["harness_job"]["net_isolated"] = iso["netns"]
    init = os.fork()  # in a new PID namespace this child is its pid 1
    if init == 0:
        try:
            run_init(job, iso, result_fd)
        except BaseException as e:
            os.write(2, f"sandbox: cannot set up: {e!r}\n".encode())
        finally:
            os._exit(126)
    os.close(result_fd)
    _, status = os.waitpid(init, 0)
    if not iso["pidns"] and iso["uid_drop"] and job["uid_unique"]:
        sweep_uid(job["uid"])
    exit_like(status)


if __name__ == "__main__":
    main()
