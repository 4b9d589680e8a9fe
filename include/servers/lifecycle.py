"""Build the commands that start, lease, inspect and stop one server process on its host.

Pure functions, like ``include.servers.commands``: paths and owner in, one POSIX ``sh``
command out, every value ``shlex.quote``d. Every file they write is private to the user
(``umask 077``): SGLang logs its arguments, API key included.

A server may serve several runs at once (a backfill started while another run generates). Each
run that uses it holds a lease, one file in ``server-<port>.leases/`` naming the run; a teardown
drops its own lease and stops the server only when no lease is left. A lock (``flock`` on
``server-<port>.flock``) makes "start or reuse, and lease" and "release, and stop if no lease is
left" one step each, so a teardown never stops a server between another run's check and its
lease.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from include.servers.commands import ServerPaths

#: How long a command waits for another command's lock on the same server before failing.
LOCK_WAIT_S = 120.0


def lease_name(owner: str) -> str:
    """Return the file name of ``owner``'s lease: readable, safe in a path, unique per owner."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", owner).strip("._")[:80]
    return f"{readable}-{hashlib.sha256(owner.encode()).hexdigest()[:10]}"


def _lock(paths: ServerPaths, wait_s: float = LOCK_WAIT_S) -> str:
    """Return lines that make the log directory safe, then take the server's lock.

    The directory must be the user's own, not a link and not writable by others: pid, lease
    and key files are written there, and in a shared directory (``/tmp``) another user could
    plant links or swap files. The lock is ``flock`` on a file there, held on fd 9 until the
    command exits: the kernel releases it when its holder dies, so no waiter has to judge a
    holder dead and take over (two waiters doing that at once could both win). A lock held
    longer than ``wait_s`` fails the command (exit 3), naming it.
    """
    q = shlex.quote
    log_dir, lock = q(paths.log_dir), q(paths.lock_file)
    return "\n".join(
        [
            "umask 077",
            f"mkdir -p {log_dir}",
            *_refuse_unsafe_dir(paths),
            "command -v flock >/dev/null 2>&1 || { echo \"flock (util-linux) is not installed "
            "on the GPU host\" >&2; exit 3; }",
            f"exec 9>>{lock}",
            f"flock -w {wait_s:.0f} 9 || {{ echo \"lock \"{lock}\" held for {wait_s:.0f} s: "
            'a launch or teardown of this server still runs" >&2; exit 3; }',
        ]
    )


def _refuse_unsafe_dir(paths: ServerPaths) -> list[str]:
    """Return lines that exit 4 if the log directory is a link, another's, or others can write.

    Only where it exists: a status read before the first launch finds nothing and says so.
    """
    q = shlex.quote
    log_dir = q(paths.log_dir)
    return [
        f"if [ -L {log_dir} ] || {{ [ -e {log_dir} ] && [ ! -O {log_dir} ]; }}; then",
        f'  echo {log_dir}" is a link or not owned by $(id -un); give the servers a '
        'directory of their own (REGEN_SERVER_LOG_DIR)" >&2; exit 4',
        "fi",
        f"if [ -e {log_dir} ]; then case $(stat -c %A {log_dir}) in ?????w????|????????w?)",
        f'  echo {log_dir}" is writable by other users; chmod 700 it or give the servers a '
        'directory of their own (REGEN_SERVER_LOG_DIR)" >&2; exit 4;;',
        "esac; fi",
    ]


def _add_lease(paths: ServerPaths, owner: str | None) -> list[str]:
    if not owner:
        return []
    q = shlex.quote
    lease = f"{paths.lease_dir}/{lease_name(owner)}"
    return [f"mkdir -p {q(paths.lease_dir)}", f"printf '%s\\n' {q(owner)} > {q(lease)}"]


def _count_leases(paths: ServerPaths) -> str:
    q = shlex.quote
    return "\n".join(
        [
            f"leases=$(ls -A {q(paths.lease_dir)} 2>/dev/null | wc -l | tr -d ' ')",
            f"holders=$(cat {q(paths.lease_dir)}/* 2>/dev/null | tr '\\n' ',' | sed 's/,$//')",
        ]
    )


def _write_config_from_stdin(paths: ServerPaths, size: int) -> list[str]:
    """Return lines storing the command's stdin, ``size`` bytes, as the server's config file.

    The old file is removed first and the new one created exclusively (``set -C``) under
    ``umask 077``, so it is never readable by others and a planted file or link is never
    written through. The directory must belong to the user (another user could swap the
    file). A short file (a container prefix that does not pass stdin on) is removed and the
    command fails (exit 6): a server must never start without its key.
    """
    q = shlex.quote
    cfg = q(paths.config_file)
    return [
        f"if [ ! -O {q(paths.log_dir)} ]; then",
        f'  echo {q(paths.log_dir)}" is not owned by $(id -un); give the servers a directory '
        'of their own (REGEN_SERVER_LOG_DIR)" >&2; exit 4',
        "fi",
        f"rm -f {cfg}",
        f"(set -C; cat > {cfg}) || exit 5",
        f"chmod 600 {cfg}",
        f"got=$(wc -c < {cfg} | tr -d ' ')",
        f'if [ "$got" != {int(size)} ]; then',
        f"  rm -f {cfg}",
        f'  echo "the server config "{cfg}" got $got of {int(size)} bytes on stdin: a '
        'command_prefix must pass stdin on (e.g. docker exec -i)" >&2; exit 6',
        "fi",
    ]


def _reuse_if_running(paths: ServerPaths, owner: str | None, config_bytes: int | None
                      ) -> list[str]:
    """Return lines that, under the lock, lease a server another launch started meanwhile.

    A run decides to start a server from a status read without the lock; another run's launch
    may have started one since (it held the lock while this one waited). Starting a second
    process would orphan the first (its pid file overwritten, never stopped) and leave the
    port to whichever bound first. So the check is repeated under the lock: a live server is
    leased, not replaced, and the command prints ``pid=<N> already=1``. Its config (and key)
    are left as they are; the stdin meant for a new config is read and discarded.
    """
    discard = [f"head -c {int(config_bytes)} >/dev/null"] if config_bytes is not None else []
    return [
        _shell_helpers(paths.port),
        _read_pid(paths.pid_file),
        'if [ -n "$pid" ] && is_server "$pid"; then',
        *(f"  {line}" for line in [*discard, *_add_lease(paths, owner)]),
        '  echo "pid=$pid already=1"; exit 0',
        "fi",
    ]


def build_detached_command(
    launch_command: str,
    paths: ServerPaths,
    *,
    owner: str | None = None,
    config_bytes: int | None = None,
    pid_wait_s: float = 5.0,
) -> str:
    """Return a command that starts ``launch_command`` detached and prints ``pid=<N>``.

    The server runs in its own session (``setsid``; ``nohup`` where setsid is missing) with
    stdin from /dev/null and output appended to the log file, so it outlives the SSH session.
    The pid is written by the detached shell itself (``$$`` right before ``exec``), which is
    the server's pid and process-group id whether or not setsid forked. The previous log is
    kept as ``.log.prev``. Under the server's lock, ``owner``'s lease is added, so no teardown
    of another run stops the new server before it is leased. With ``config_bytes`` the
    command's stdin (that many bytes) becomes the server's ``--config`` file first
    (``ServerPaths.config_file``). Prints ``pid=`` (empty) when no pid file appeared in time,
    and ``pid=<N> already=1`` when, once it held the lock, a live server was already there
    (another run's launch got the lock first): that server is leased and left running.
    """
    q = shlex.quote
    inner = f"echo $$ > {q(paths.pid_file)}; exec {launch_command}"
    tries = max(1, int(pid_wait_s / 0.1))
    lines = [
        _lock(paths),
        *_reuse_if_running(paths, owner, config_bytes),
        *(_write_config_from_stdin(paths, config_bytes) if config_bytes is not None else []),
        f"rm -f {q(paths.pid_file)}",
        f"if [ -f {q(paths.log_file)} ]; then mv -f {q(paths.log_file)} "
        f"{q(paths.previous_log_file)}; fi",
        f"printf '%s\\n' {q(owner or '')} > {q(paths.owner_file)}",
        *_add_lease(paths, owner),
        f"echo \"[launcher] $(date '+%Y-%m-%d %H:%M:%S') starting on $(hostname)\" "
        f"> {q(paths.log_file)}",
        "if command -v setsid >/dev/null 2>&1; then run=setsid; else run=nohup; fi",
        # fd 9 holds the lock: the server must not inherit it (it would hold it for life).
        f"$run sh -c {q(inner)} </dev/null >>{q(paths.log_file)} 2>&1 9>&- &",
        f"i=0; while [ ! -s {q(paths.pid_file)} ] && [ $i -lt {tries} ]; do "
        "sleep 0.1; i=$((i+1)); done",
        f'echo "pid=$(cat {q(paths.pid_file)} 2>/dev/null)"',
    ]
    return "\n".join(lines)


# Shell helpers shared by the status and stop commands. A pid counts as this server only if
# it is alive, not a zombie and its command line holds "--port <port>": a pid file outliving a
# reboot may name an unrelated process that must never be signalled.
def _shell_helpers(port: int) -> str:
    return "\n".join(
        [
            "is_server() {",
            '  kill -0 "$1" 2>/dev/null || return 1',
            '  st=$(sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f1)',
            '  [ "$st" = Z ] && return 1',
            '  [ -r /proc/"$1"/cmdline ] || return 0',
            f'  tr "\\000" " " < /proc/"$1"/cmdline | grep -q -- "--port {int(port)} "',
            "}",
        ]
    )


def _read_pid(pid_file: str) -> str:
    q = shlex.quote
    return "\n".join(
        [
            f"pid=$(head -c 32 {q(pid_file)} 2>/dev/null | tr -cd 0-9)",
            # A pid of 0 or 1 would turn `kill -- -$pid` into a broadcast; never allow it.
            'if [ -n "$pid" ] && [ "$pid" -le 1 ]; then pid=; fi',
        ]
    )


def _status_lines(paths: ServerPaths) -> str:
    q = shlex.quote
    return "\n".join(
        [
            _shell_helpers(paths.port),
            _read_pid(paths.pid_file),
            'alive=0; if [ -n "$pid" ] && is_server "$pid"; then alive=1; fi',
            _count_leases(paths),
            f"owner=$(head -n 1 {q(paths.owner_file)} 2>/dev/null)",
            'echo "pid=$pid alive=$alive leases=$leases owner=$owner"',
        ]
    )


def build_status_command(paths: ServerPaths) -> str:
    """Return a command printing ``pid=<N|> alive=<0|1> leases=<n> owner=<text>``.

    ``alive=1`` only when the pid file names a live, non-zombie process serving this port;
    ``leases`` counts the runs holding a lease on it; ``owner`` is the run that started it.
    The command exits 0, or 4 when the log directory is unsafe to read (a link, another
    user's, writable by others: its pid file could name any process); any other non-zero
    exit means the host or prefix itself failed.
    """
    return "\n".join([*_refuse_unsafe_dir(paths), _status_lines(paths)])


def build_acquire_command(paths: ServerPaths, owner: str) -> str:
    """Return a command that adds ``owner``'s lease on a server and prints its status.

    The status line (as ``build_status_command``) is taken under the lock after the lease was
    written: with ``alive=1`` no teardown can stop the server until ``owner`` releases it.
    """
    return "\n".join([_lock(paths), *_add_lease(paths, owner), _status_lines(paths)])


def _stop_lines(paths: ServerPaths, grace_s: float) -> str:
    q = shlex.quote
    tries = max(1, int(grace_s / 0.2))
    # The key file goes with the process; it stays only beside a process that survived.
    forget = f"rm -f {q(paths.pid_file)} {q(paths.config_file)}"
    return "\n".join(
        [
            _shell_helpers(paths.port),
            _read_pid(paths.pid_file),
            'if [ -z "$pid" ] || ! is_server "$pid"; then',
            f'  {forget}; echo "not-running pid=$pid"; exit 0',
            "fi",
            'kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null',
            f'i=0; while is_server "$pid" && [ $i -lt {tries} ]; do sleep 0.2; i=$((i+1)); done',
            'if is_server "$pid"; then',
            '  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null',
            '  i=0; while is_server "$pid" && [ $i -lt 25 ]; do sleep 0.2; i=$((i+1)); done',
            "fi",
            'if is_server "$pid"; then echo "still-alive pid=$pid"; exit 0; fi',
            f'{forget}; echo "stopped pid=$pid"',
        ]
    )


def build_stop_command(paths: ServerPaths, *, grace_s: float = 20.0) -> str:
    """Return a command that stops one server by its pid file, whatever its leases say.

    SIGTERM goes to the whole process group, then the command waits up to ``grace_s``, then
    SIGKILLs the group and waits 5 s more. Output is one line: ``stopped pid=N``,
    ``not-running pid=N`` (stale or missing pid file) or ``still-alive pid=N``; the pid and
    key files are removed unless the process survived. Runs use ``build_release_command``.
    """
    return "\n".join([_lock(paths), _stop_lines(paths, grace_s)])


def build_release_command(
    paths: ServerPaths, owner: str | None, *, grace_s: float = 20.0
) -> str:
    """Return a command that drops ``owner``'s lease and stops the server if no lease is left.

    Under the server's lock: with leases of other runs left it prints ``kept leases=<n>
    holders=<their owners, comma-separated>`` and leaves the server alone; otherwise it stops
    it as ``build_stop_command`` does and prints that command's outcome line.
    """
    q = shlex.quote
    drop = f"rm -f {q(paths.lease_dir + '/' + lease_name(owner))}" if owner else ":"
    return "\n".join(
        [
            _lock(paths),
            drop,
            _count_leases(paths),
            'if [ "$leases" -gt 0 ]; then echo "kept leases=$leases holders=$holders"; exit 0; fi',
            f"rmdir {q(paths.lease_dir)} 2>/dev/null",
            _stop_lines(paths, grace_s),
        ]
    )
