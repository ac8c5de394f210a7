"""A real single-node Slurm cluster for the tests: Debian's Slurm 22.05 (``slurmctld``, ``slurmd``, the client
commands) and MUNGE, started as root without systemd, every file under one scratch folder, on ports of its own.

- :func:`unusable_reason`: ``None`` when Slurm can run here (installing the packages with apt-get when they are
  missing), otherwise why not, for the skip message;
- :func:`running_cluster`: starts ``munged``, ``slurmctld`` and ``slurmd``, waits until the node is idle and yields a
  :class:`SlurmCluster`; on the way out, whatever happened, it cancels every job, stops the daemons by PID and kills
  any process of the cluster that is left;
- :class:`SlurmCluster`: submit a batch script, read and wait for a job's state, signal its batch shell, kill its
  processes as a lost node would, requeue it.

Latency traps (Slurm 22.05): the scheduler waits ``batch_sched_delay`` (3 s) before starting a batch job and scans the
queue in full every ``sched_interval`` (60 s) only, both lowered here; a requeued job becomes eligible
``cred_expire + 1`` s after its previous run ended (121 s by default, :data:`CRED_EXPIRE_S` + 1 here); ``squeue -j``
prints nothing once a job has ended (:meth:`SlurmCluster.job` reads ``scontrol show job``); the ``--signal`` timer
and the time limit are checked every 30 s (hard-coded), so a signal comes up to 30 s before its lead time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_scale import knobs
from lightning_scale.testing.processes import kill_processes
from tests.debian import SYSTEM_PATH, apt_get_install
from tests.debian import command as find_command

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
CRED_EXPIRE_S = 5  # the least Slurm accepts
KILL_WAIT_S = 10  # SIGTERM to SIGKILL when a job is cancelled, requeued or times out
MARKER = "LIGHTNING_SCALE_SLURM_SCRATCH"  # in the environment of every process of a cluster: its scratch folder
TERMINAL_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}
)
# Input variables of the client commands (SBATCH_TIMELIMIT overrides a script's #SBATCH line, SQUEUE_FORMAT the
# output) and a job's own variables (SLURM_JOB_ID would tell Lightning that it runs in a job): none may leak in.
_SLURM_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCONTROL_", "SCANCEL_")


def unusable_reason() -> str | None:
    """``None`` when a Slurm cluster can run here, after installing Debian's packages when they are missing (as root,
    with apt-get); otherwise why it cannot."""
    if not sys.platform.startswith("linux"):
        return f"Slurm's daemons run on Linux only, not on {sys.platform}"
    if os.geteuid() != 0:
        return f"the test cluster runs its daemons as root (SlurmUser=root); this process runs as uid {os.geteuid()}"
    if not _missing_commands():
        return None
    if find_command("apt-get") is None:
        return f"{', '.join(_missing_commands())} not installed, and no apt-get to install {' '.join(PACKAGES)}"
    problem = apt_get_install(PACKAGES)
    missing = _missing_commands()
    if missing:
        return f"{', '.join(missing)} still missing after `apt-get install {' '.join(PACKAGES)}`: {problem}"
    warnings.warn(f"the Slurm tests installed {' '.join(PACKAGES)} with apt-get; they stay installed", stacklevel=1)
    return None


def _missing_commands() -> list[str]:
    return [name for name in COMMANDS if find_command(name) is None]


def parse_job_line(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one line of ``scontrol show job -o``.

    Example:
        >>> fields = parse_job_line("JobId=7 JobName=train JobState=PENDING Reason=BeginTime Restarts=1 TRES=cpu=2")
        >>> fields["JobState"], fields["Restarts"], fields["TRES"]
        ('PENDING', '1', 'cpu=2')
    """
    return dict(re.findall(r"([^\s=]+)=(\S*)", line))


def slurm_conf(scratch: Path, node: str, cpus: int, munge_socket: Path, ports: tuple[int, int]) -> str:
    """``slurm.conf`` of a one-node cluster on 127.0.0.1, run as root, its state, spool, pid and log files under
    ``scratch``, ``ports`` for slurmctld and slurmd."""
    return "\n".join(
        [
            "ClusterName=lightningscale",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={scratch}/state",
            f"SlurmdSpoolDir={scratch}/spool",
            f"SlurmctldPidFile={scratch}/slurmctld.pid",
            f"SlurmdPidFile={scratch}/slurmd.pid",
            f"SlurmctldLogFile={scratch}/slurmctld.log",
            f"SlurmdLogFile={scratch}/slurmd.log",
            # with proctrack/linuxproc a job's background children outlived it; pgid signals the process groups
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",  # memory is not a resource: the node's size is not measured
            "SlurmdParameters=config_overrides",  # trust CPUs= below, whatever hwloc finds in a container
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "JobRequeue=1",
            "ReturnToService=2",
            f"KillWait={KILL_WAIT_S}",
            "SchedulerType=sched/builtin",
            # start a submitted job at once, and scan the queue every second (a requeued job becomes eligible with
            # no event that would start it: by default it waited for the next full scan, up to 60 s)
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class SlurmCluster:
    """A running single-node cluster: its files, its clients' environment, and the job commands the tests need.

    Attributes:
        scratch: The folder that holds every file of the cluster (config, state, spool, logs, MUNGE key and socket).
        conf: Its ``slurm.conf``.
        node: The node's name (this machine's short host name).
        cpus: CPUs the node offers.
        env: This process's environment without Slurm's variables, plus ``SLURM_CONF`` (the client commands, and the
            jobs submitted with it, talk to this cluster) and the marker that finds the cluster's processes when it
            stops. Not exported to ``os.environ``: the commands below pass it.
    """

    scratch: Path
    conf: Path
    node: str
    cpus: int
    env: dict[str, str]
    daemons: list[_Daemon]

    def run(self, *command: str, timeout_s: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a client command (``scontrol``, ``sinfo``...) against this cluster; with ``check``, a non-zero exit
        raises ``RuntimeError`` with its error output."""
        executable = find_command(command[0]) or command[0]
        done = subprocess.run([executable, *command[1:]], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return done

    def job_env(self, **extra: str) -> dict[str, str]:
        """The environment to submit a job with (``sbatch`` hands it on to the batch script, ``srun`` to the tasks):
        this cluster's, with this interpreter's folder first on ``PATH`` (the script runs ``python``), the repository
        on ``PYTHONPATH``, one thread per process, the rendezvous on 127.0.0.1 at a free port (Lightning's SLURM
        default, 15000 plus the job id's last digits, would be the same port for job 1 of two clusters), and
        ``extra``."""
        return {
            **self.env,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", ""), *SYSTEM_PATH]),
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_ports(1)[0]),
            # this test's node memory (the autouse fixture's), removed after it, not the default shared by every test
            "LIGHTNING_SCALE_SNAPSHOT_DIR": os.environ.get("LIGHTNING_SCALE_SNAPSHOT_DIR", knobs.SNAPSHOT_DIR),
            **extra,
        }

    def submit(self, script: Path, *options: str, args: Sequence[str] = (), cwd: Path = ROOT,
               env: Mapping[str, str] | None = None) -> str:  # fmt: skip
        """``sbatch --parsable OPTIONS SCRIPT ARGS`` from ``cwd`` (the job's working directory) with ``env`` (default:
        :meth:`job_env`); the job id. Options on the command line override the script's ``#SBATCH`` lines."""
        command = [find_command("sbatch") or "sbatch", "--parsable", *options, str(script), *args]
        done = subprocess.run(command, env=dict(env or self.job_env()), cwd=cwd, capture_output=True, text=True,
                              timeout=30)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"sbatch refused {script.name} {' '.join(options)}: {done.stderr.strip()[-500:]}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields from ``scontrol show job -o`` (``JobState``, ``Restarts``, ``ExitCode``, ``Reason``...),
        also after it ended (until ``MinJobAge``, 300 s, has passed), where ``squeue -j`` prints nothing."""
        return parse_job_line(self.run("scontrol", "show", "job", "-o", job_id).stdout.splitlines()[0])

    def wait_for(
        self, job_id: str, states: Collection[str], timeout_s: float, restarts: int | None = None
    ) -> dict[str, str]:
        """Poll the job until its ``JobState`` is one of ``states`` (after ``restarts`` requeues, when given); its
        fields then.

        Raises:
            AssertionError: The job ended in another state, is held (a failed launch holds a requeued job), or
                ``timeout_s`` passed; with its fields and the tails of the daemons' logs.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if state in states and (restarts is None or fields.get("Restarts") == str(restarts)):
                return fields
            held = fields.get("Reason", "").startswith("JobHeld")  # a failed launch holds a requeued job
            if state in TERMINAL_STATES or held or time.monotonic() > deadline:
                wanted = f"{'/'.join(sorted(states))}" + ("" if restarts is None else f" with Restarts={restarts}")
                why = f"ended {state}" if state in TERMINAL_STATES else f"is {state} after {timeout_s:.0f} s"
                why = f"is held ({fields.get('Reason')})" if held else why
                raise AssertionError(f"job {job_id} {why}, not {wanted}: {fields}\n{self.log_tails()}")
            time.sleep(0.2)

    def signal_batch(self, job_id: str, name: str = "USR1") -> None:
        """Send signal ``name`` to the job's batch shell only, as ``--signal=B:USR1@N`` does at the time limit."""
        self.run("scancel", f"--signal={name}", "--batch", job_id)

    def kill(self, job_id: str) -> list[int]:
        """SIGKILL every process of the job at once, as when its node dies: no process gets a notice, and the batch
        shell's death ends the job ``FAILED`` (``ExitCode=0:9``); the PIDs killed. Not ``scancel --signal=KILL``:
        slurmctld treats that as a cancel (``CANCELLED``, the steps get SIGTERM first), or with ``--batch`` kills the
        shell only, and the steps then get SIGTERM, which the training processes take for a preemption notice."""
        return kill_processes(processes_of(self.scratch, job_id))

    def requeue(self, job_id: str) -> None:
        """Put the job back in the queue (a running job is stopped first: SIGTERM, then SIGKILL ``KillWait`` later).
        It becomes eligible :data:`CRED_EXPIRE_S` + 1 s after its run ended, and then runs again with
        ``SLURM_RESTART_COUNT`` one higher."""
        self.run("scontrol", "requeue", job_id)

    def node_is_idle(self) -> bool:
        """Whether the controller answers and the node is idle (registered, no job on it)."""
        done = self.run("sinfo", "--noheader", "--Node", "--format=%T", check=False)
        return done.returncode == 0 and done.stdout.split() == ["idle"]

    def log_tails(self) -> str:
        """The end of each daemon's log, for failure messages."""
        return _log_tails(self.daemons)


def free_ports(count: int) -> list[int]:
    """``count`` different ports that nothing listens on now (the OS hands them out at random, so two test runs
    choosing at the same time do not get the same ones)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def processes_of(scratch: Path, job_id: str | None = None) -> list[int]:
    """Live processes that carry the cluster's marker in their environment: its daemons, the ``slurmstepd`` they
    start (which inherit ``slurmd``'s environment), and every process of its jobs (which inherit the submitter's);
    with ``job_id``, only the processes of that job (``SLURM_JOB_ID`` in their environment: not its slurmstepd)."""
    needles = {f"{MARKER}={scratch}".encode()} | ({f"SLURM_JOB_ID={job_id}".encode()} if job_id else set())
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):  # the process ended while we looked
            if needles <= set(environ.read_bytes().split(b"\0")):
                found.append(int(environ.parent.name))
    return found


@contextlib.contextmanager
def running_cluster(keep_logs_in: Path | None = None, start_timeout_s: float = 60.0) -> Iterator[SlurmCluster]:
    """A started cluster for the duration; then every job cancelled, the daemons stopped by PID and any process of
    the cluster still alive killed, whatever happened, and the scratch folder removed (the daemons' logs copied to
    ``keep_logs_in`` first, when given).

    Raises:
        RuntimeError: A daemon did not start (with its log), or a process of the cluster outlived SIGKILL.
    """
    # Not under pytest's tmp folders: munged refuses a socket folder that not everyone can reach, and
    # /tmp/pytest-of-root is private. The scratch folder's parents must not be writable by others (munged checks).
    scratch = Path(tempfile.mkdtemp(prefix="lightning-scale-slurm-"))
    scratch.chmod(0o755)
    env = {name: value for name, value in os.environ.items() if not name.startswith(_SLURM_PREFIXES)}
    env.update({"SLURM_CONF": str(scratch / "slurm.conf"), MARKER: str(scratch)})
    daemons: list[_Daemon] = []
    try:
        yield _start(scratch, env, daemons, start_timeout_s)
    finally:
        survivors = _stop(scratch, env, daemons)
        if keep_logs_in is not None:
            for log in [*scratch.glob("*.log"), *scratch.glob("*.out")]:
                shutil.copy(log, keep_logs_in / log.name)
        shutil.rmtree(scratch, ignore_errors=True)
    if survivors:
        raise RuntimeError(f"processes {survivors} of the Slurm test cluster outlived SIGKILL")


def _start(scratch: Path, env: dict[str, str], daemons: list[_Daemon], timeout_s: float) -> SlurmCluster:
    munge = scratch / "munge"
    for folder in (munge, scratch / "state", scratch / "spool"):
        folder.mkdir(mode=0o755)
    key, munge_socket = munge / "munge.key", munge / "munge.socket"
    subprocess.run([find_command("mungekey") or "mungekey", "--create", f"--keyfile={key}"], check=True, timeout=30)
    # In the foreground munged logs to stderr (its --log-file serves a daemonized munged only). Running as root
    # needs no --force: that only overrides an existing socket, missing entropy and insecure permissions.
    munged = [find_command("munged") or "munged", "--foreground", f"--key-file={key}", f"--socket={munge_socket}"]
    munged += [f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed"]
    daemons.append(_spawn("munged", munged, scratch, env))
    _wait_until(munge_socket.exists, timeout_s, daemons, "munged's socket to appear")
    node = socket.gethostname().split(".")[0]  # `hostname -s`; slurmctld compares it with SlurmctldHost
    # at least 2 CPUs: the tests run 2-task jobs (config_overrides lets a 1-CPU machine offer 2)
    cluster = SlurmCluster(scratch, scratch / "slurm.conf", node, max(2, os.cpu_count() or 1), env, daemons)
    controller_port, node_port = free_ports(2)
    cluster.conf.write_text(slurm_conf(scratch, node, cluster.cpus, munge_socket, (controller_port, node_port)))
    conf = str(cluster.conf)
    daemons.append(
        _spawn("slurmctld", [find_command("slurmctld") or "slurmctld", "-D", "-i", "-f", conf], scratch, env)
    )
    daemons.append(_spawn("slurmd", [find_command("slurmd") or "slurmd", "-D", "-f", conf, "-N", node], scratch, env))
    _wait_until(cluster.node_is_idle, timeout_s, daemons, f"node {node} to be idle in sinfo")
    return cluster


def _spawn(name: str, command: list[str], scratch: Path, env: dict[str, str]) -> _Daemon:
    """Start a daemon in the foreground, in a session of its own (a Ctrl-C of the test run reaches pytest, whose
    clean-up stops it), its output in ``scratch/NAME.out``."""
    log = scratch / f"{name}.out"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=scratch, start_new_session=True)  # fmt: skip
    return _Daemon(name, process, log)


def _wait_until(condition: Callable[[], bool], timeout_s: float, daemons: list[_Daemon], what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        dead = [daemon for daemon in daemons if daemon.process.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0].name} exited with code {dead[0].process.returncode}" if dead else f"{timeout_s:.0f} s"
            raise RuntimeError(f"the Slurm test cluster did not start: waited for {what}; {why}\n{_log_tails(daemons)}")
        time.sleep(0.1)


def _stop(scratch: Path, env: dict[str, str], daemons: list[_Daemon]) -> list[int]:
    """Cancel every job, stop the daemons (SIGTERM, SIGKILL 10 s later), SIGKILL what is left of the cluster's
    processes (multiprocessing's resource trackers last); those that outlived it."""
    names = {daemon.name: daemon for daemon in daemons}
    if "slurmctld" in names and names["slurmctld"].process.poll() is None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # stopping goes on without it
            subprocess.run(
                [find_command("scancel") or "scancel", "--user=root"], env=env, capture_output=True, timeout=30
            )
            deadline = time.monotonic() + KILL_WAIT_S + 5
            squeue = [find_command("squeue") or "squeue", "--noheader", "--format=%i"]
            while time.monotonic() < deadline and subprocess.run(squeue, env=env, capture_output=True, text=True,
                                                                 timeout=30).stdout.strip():  # fmt: skip
                time.sleep(0.2)
    for daemon in reversed(daemons):  # slurmd, slurmctld, munged
        _terminate(daemon.process)
    # resource trackers are spared at first: each ends by itself once its processes are gone, and unlinks the named
    # semaphores they left (killed with them, it would leave those in /dev/shm); one still there 5 s later is killed
    kill_processes(processes_of(scratch))
    for pid in _left_after(scratch, 5.0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return _left_after(scratch, 5.0)


def _left_after(scratch: Path, seconds: float) -> list[int]:
    """The cluster's processes still alive once none is, or ``seconds`` later."""
    deadline = time.monotonic() + seconds
    while (left := processes_of(scratch)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _terminate(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _log_tails(daemons: list[_Daemon], lines: int = 15) -> str:
    return "\n".join(f"--- {daemon.name}:\n{_tail(daemon.log, lines)}" for daemon in daemons)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(unreadable: {err})"
