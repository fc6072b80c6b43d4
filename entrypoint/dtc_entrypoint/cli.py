"""``train``: the command SageMaker runs in the container (``docker run IMAGE train``).

Reads the ``/opt/ml`` contract (or ``$SAGEMAKER_BASE_DIR``), builds this host's launch plan,
runs it, and reports the result the way SageMaker expects: exit 0 and ``output/success``, or a
non-zero exit and ``output/failure`` whose first line says what failed.

Usage: ``train`` (run the job) or ``train --plan`` (print this host's plan as JSON, start nothing).
"""

import argparse
import atexit
import json
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Sequence

import psutil

from . import config as job_config
from . import (
    env_settings,
    forensics,
    launch,
    launchers,
    memory,
    peers,
    program,
    redact,
    report,
    stack_dump,
    supervise,
)
from .errors import (
    EXIT_CONFIG_ERROR,
    EXIT_INTERNAL_ERROR,
    EXIT_PEER_ERROR,
    EXIT_PREFLIGHT_ERROR,
    EXIT_STALLED,
    ConfigError,
    PeerError,
    PreflightError,
    ProgramNotFoundError,
    StoppedBeforeLaunch,
)
from .plan import flight_recorder_dir, heartbeat_file, stacks_dir
from .preflight.run import run as run_preflight

log = logging.getLogger("dtc")
# Under torchrun, how long a host whose peer's train has closed waits for its own training to end
# before it counts the peer as lost (DTC_PEER_END_GRACE_S; _peer_watch).
PEER_END_GRACE_S = 20.0
# With a presence (launchers.Launcher.presence), how long a host whose training failed answers the others'
# watch with its failure line (peers.Presence.fail; they poll every 2 s), and how long a host whose own account is only
# "host X stopped answering" waits for host X's line (DTC_PEER_NOTICE_WAIT_S).
PRESENCE_LINGER_S = 6.0
PEER_NOTICE_WAIT_S = 15.0
# With a presence, how long a host whose training succeeded waits for the master's train to end
# (DTC_MASTER_END_WAIT_S; _hold_until_the_master_ends).
MASTER_END_WAIT_S = 1800.0
# CPU-seconds within supervise.BUSY_WINDOW_S (10 s) that count as a job's progress: a tenth of a core.
# A job waiting in Gloo, a lock or a sleep uses next to none (torchrun's agent polls its ranks).
BUSY_CPU_S = 1.0

# the sagemaker_* hyperparameters train reads besides the launchers' flags (launchers.flags)
FRAMEWORK_PARAMETERS = {
    job_config.MPI_PROCESSES_PER_HOST, job_config.MPI_NUM_PROCESSES, job_config.MPI_CUSTOM_OPTIONS,
    job_config.PREFLIGHT, job_config.STALL_TIMEOUT, job_config.STALL_STARTUP_GRACE, job_config.STALL_ACTION,
    "sagemaker_instance_type", "sagemaker_distribution_instance_groups",
}


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="print this host's launch plan as JSON and exit")
    if argv[:1] == ["train"]:  # `docker run IMAGE train` through an entry script passes it on
        argv = argv[1:]
    return parser.parse_args(argv)


def _plan_for(config: job_config.JobConfig, fetch: bool) -> tuple[program.Program, launch.LaunchPlan]:
    if fetch:
        prog = program.fetch(config)
    else:
        try:
            prog = program.classify(config)
        except ProgramNotFoundError:  # not fetched yet: describe it by its name
            path = os.path.join(config.code_dir, config.program)
            prog = program.Program(config.program, config.program.endswith(".py"), (path,), config.code_dir)
    return prog, launch.build(config, prog)


class _Phase:
    """What ``train`` is doing before the training processes start. Installed as the handler of
    SIGTERM/SIGINT: a stop then ends the job in that phase (``StoppedBeforeLaunch``); once
    ``supervise.run`` (or an MPI worker host's wait) runs, it handles them itself."""

    def __init__(self, current: str):
        self.current = current
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)

    def __call__(self, signum, _frame):
        raise StoppedBeforeLaunch(signum, self.current)


def _peer_names(plan: launch.LaunchPlan, addresses: dict[str, str]) -> dict[str, str]:
    """What training processes call the other hosts -> host: their addresses (Gloo) and their
    TensorFlow tasks (``worker:1``), for naming a lost one (``report.lost_peer``)."""
    names = {address: host for host, address in addresses.items()}
    for job, tasks in (plan.tf_config or {}).get("cluster", {}).items():
        for index, task in enumerate(tasks):
            names[f"{job}:{index}"] = task.rpartition(":")[0]
    return names


def _has_presence(plan: launch.LaunchPlan) -> bool:
    """Whether this job's hosts serve and watch each other's ``peers.Presence``
    (``launchers.Launcher.presence``, on several hosts): the hosts' user programs wait for each
    other in collectives, so a stall or failure on one host is read on every host."""
    return len(plan.hosts) > 1 and launchers.of(plan.strategy).presence


def _peer_watch(plan: launch.LaunchPlan, current_host: str, ports: launchers.Ports):
    """A ``supervise.run`` watch that reports the first other host whose server closes (or
    stops answering: a machine that died silently closes no connection). With a presence
    (``launchers.Launcher.presence``; torchrun, MultiWorkerMirrored), on every host, the other
    hosts' ``train`` (``peers.Presence`` on ``DTC_PRESENCE_PORT``): a host whose training failed
    says why (``report.peer_failed``); where a closed presence is a lost host
    (``presence_close_is_loss``; torchrun: Gloo would wait for a silently lost host for 30
    minutes) that too, while under MultiWorkerMirrored TensorFlow's heartbeats find a lost host
    and a worker may end well before the chief has written the model. Otherwise, on the master,
    the servers its launcher names (``master_watch``: MPI's sshd on the other hosts, the
    parameter-server chief's TensorFlow servers), seen up from the start (the launcher's
    ``host_part`` waited for them). ``None`` otherwise."""
    if len(plan.hosts) < 2:
        return None
    launcher = launchers.of(plan.strategy)
    others = [host for host in plan.hosts if host != current_host]
    endpoints, seen_up = {}, ()
    if _has_presence(plan):
        endpoints = {(host, ports["presence"]): "train" for host in others}
    elif plan.master_host == current_host and launcher.master_watch:
        endpoints = launcher.master_watch(plan, current_host)
        seen_up = tuple(endpoints)   # the launcher's host_part waited for each to answer
    if not endpoints:
        return None

    # where a closed presence is a lost host (torchrun), the first host whose training ends closes
    # first, while the others' torchrun may still be leaving its exit barrier: they get a grace
    # period to end on their own (a success is a success) before the host counts as lost.
    closes = launcher.presence_close_is_loss or not launcher.presence
    grace_s = (env_settings.seconds("DTC_PEER_END_GRACE_S", PEER_END_GRACE_S)
               if launcher.presence_close_is_loss else 0.0)
    presence = _has_presence(plan)

    def watch(done) -> str | None:
        gone = peers.watch_until_one_closes(list(endpoints), stop=done, notices=presence, closes=closes,
                                            seen_up=seen_up)
        if gone is None:
            return None
        if gone.notice:   # the host's training failed, and its train said why
            return report.peer_failed(gone.host, gone.notice)
        deadline = time.monotonic() + grace_s
        while not done() and time.monotonic() < deadline:
            time.sleep(0.5)
        return report.lost_host(gone.host, f"its {endpoints[gone.host, gone.port]} ({gone.host}:{gone.port}) stopped "
                                           "answering while the job ran")

    return watch


def _stall_rule(config: job_config.JobConfig, plan: launch.LaunchPlan) -> supervise.StallRule | None:
    """This host's ``supervise.StallRule`` (``config.stall_timeout_s``; ``None`` when 0). On a
    stall it asks every Python process for its stacks (``stack_dump``), keeps this host's
    in ``output/data/forensics/stacks`` and says where each rank is (``forensics``): the
    failure's first line, then each process's main-thread frames.

    The master judges the job's progress by its own output (under MPI every rank's; otherwise its
    ranks', rank 0 among them, which a stall anywhere stops too). With a presence
    (``launchers.Launcher.presence``: torchrun, MultiWorkerMirrored) the other hosts, whose ranks
    print nothing in a healthy job, do not judge: they read their ranks' stacks when the master
    reports a stall (``StallRule.judges``, ``peers.Presence``). Other launchers' other hosts have
    no rule: under MPI the master reads their ranks' stacks itself (``peer_stacks``), and the
    parameter-server hosts run no user code. A launcher whose waiting ranks spin
    (``output_is_progress``: MPI) counts only output as progress, less its ``quiet`` lines
    (Horovod's stall warnings: ``launch_mpi.horovod_stall_env``); the others count a busy CPU too."""
    if not config.stall_timeout_s:
        return None
    judges = config.is_master
    if not judges and not _has_presence(plan):
        return None
    launcher = launchers.of(plan.strategy)

    def read_stacks() -> forensics.Reading:
        # under MPI through mpirun, which passes the signal to every rank on every host; the other
        # hosts' dumps are copied here over ssh (each host also keeps its own: mpi_job.serve_worker)
        mpirun = [p.pid for p in psutil.Process().children(recursive=True) if p.name() in ("mpirun", "orterun")]
        paths = stack_dump.request(stacks_dir(config), via=mpirun[0] if mpirun else None)
        if launcher.peer_stacks:
            paths += launcher.peer_stacks([h for h in plan.hosts if h != config.current_host], stacks_dir(config))
        return forensics.read(paths, config.output_dir, config.current_host)

    def on_stall(idle_s: float, stderr_tail: Sequence[str]) -> str:
        reading = read_stacks()
        horovod = report.horovod_missing(stderr_tail)   # the tensors Horovod's stall inspector names
        return "\n".join([f"stalled {idle_s:.0f} s: {reading.where}{f'; {horovod}' if horovod else ''} (no output and "
                          f"no heartbeat for {idle_s:.0f} s: {job_config.STALL_TIMEOUT}={config.stall_timeout_s}; "
                          f"every process's stacks in {reading.folder})", "", *reading.details]) + "\n"

    # a silent job that computes is not stalled, unless its waiting ranks spin
    return supervise.StallRule(config.stall_timeout_s, config.stall_startup_grace_s, heartbeat_file(config),
                               on_stall, judges, busy_cpu_s=None if launcher.output_is_progress else BUSY_CPU_S,
                               ends_job=config.stall_action == "end", quiet=launcher.quiet)


def _peer_notice(config: job_config.JobConfig, hosts: list[str], extra_s: float = 0.0) -> peers.Gone | None:
    """Under torchrun and MultiWorkerMirrored: the first of ``hosts`` whose ``train`` says why its
    training failed (``peers.Presence.fail``) within ``$DTC_PEER_NOTICE_WAIT_S`` (plus ``extra_s``), or ``None``.
    A host whose presence does not answer now (lost, cut off, or done saying) is not waited for."""
    answering = []
    for host in hosts:
        said = peers.failure_notice(host, config.ports["presence"])
        if said:
            return peers.Gone(host, config.ports["presence"], said)
        if said is not None:
            answering.append(host)
    if not answering:
        log.info("%s does not answer: no word on why its training failed", " or ".join(hosts))
        return None
    wait_s = env_settings.seconds("DTC_PEER_NOTICE_WAIT_S", PEER_NOTICE_WAIT_S) + extra_s
    log.info("waiting up to %.0f s for %s to say why its training failed", wait_s, " or ".join(answering))
    deadline = time.monotonic() + wait_s
    endpoints = [(host, config.ports["presence"]) for host in answering]
    said = peers.watch_until_one_closes(endpoints, closed_checks=1, notices=True, seen_up=endpoints,
                                        stop=lambda: time.monotonic() > deadline)
    return said if said is not None and said.notice else None


def _hold_until_the_master_ends(config: job_config.JobConfig, plan: launch.LaunchPlan) -> None:
    """On a host other than the master (``launchers.Launcher.presence``) whose training succeeded: waits
    until the master's ``train`` has ended (its presence closed) or ``$DTC_MASTER_END_WAIT_S``
    (1800 s) have passed. Under MultiWorkerMirrored a worker ends as soon as its last step is done,
    while the chief may still be writing the model (TensorFlow's tutorials save on the chief only),
    and SageMaker SDK local mode (``docker compose up --abort-on-container-exit``) stops every
    other host's container, the chief's included, when one exits. MPI's worker hosts and
    parameter-server hosts already wait for the master; so does torchrun's exit barrier, within
    its own time. A master that does not answer (already gone) is not waited for."""
    endpoint = (plan.master_host, config.ports["presence"])
    if peers.failure_notice(*endpoint) is None:
        return
    wait_s = env_settings.seconds("DTC_MASTER_END_WAIT_S", MASTER_END_WAIT_S)
    log.info("training ended here; waiting up to %.0f s for the master %s's train to end (it may still be writing "
             "the model)", wait_s, plan.master_host)
    deadline = time.monotonic() + wait_s
    # seen_up: the master answered just now; its train may end before the watch's first poll (under
    # torchrun every host's agent leaves the exit barrier together), and a presence that closed
    # then must end this wait, not keep it for DTC_MASTER_END_WAIT_S (make gpu-verify, 2026-12-03:
    # two torchrun examples' worker hosts held 15 minutes, until the cluster's timeout)
    gone = peers.watch_until_one_closes([endpoint], closed_checks=1, notices=True, seen_up=[endpoint],
                                        stop=lambda: time.monotonic() > deadline)
    if gone is None:
        log.warning("the master %s's train had not ended after %.0f s (DTC_MASTER_END_WAIT_S): leaving",
                    plan.master_host, wait_s)
    elif gone.notice:
        log.warning("the master %s failed: %s", plan.master_host, gone.notice)
    else:
        log.info("the master %s's train has ended", plan.master_host)


def _stall_account(config: job_config.JobConfig, plan: launch.LaunchPlan, result: supervise.RunResult,
                   presence: peers.Presence | None) -> str:
    """The failure file of a job this host's stall rule ended: where the ranks were
    (``result.stalled``), then the end of stderr. When every rank here only waits for one
    elsewhere, the line of the host where a rank is stuck comes first: the one that reported the
    stall (``result.peer_lost``), or, on the master (``peers.Presence``), the first that answers its
    word (``peers.Presence.say``: the others read their ranks' stacks on it); the master then
    copies the other hosts' stacks into its own ``forensics/stacks`` (``peers.fetch_files``)."""
    text = "\n".join([result.stalled.rstrip("\n"), "", "Last lines of stderr before the job was ended:",
                      *(line for line in result.stderr_tail[-40:] if line.strip())]) + "\n"
    waiting_here = forensics.NOT_ON_THIS_HOST in text.splitlines()[0]
    if result.peer_lost:
        return (f"{result.peer_lost}\n\nOn this host, {text}" if waiting_here
                else f"{text}\n(The stall was found by another host: {result.peer_lost})\n")
    if presence is not None and waiting_here:
        presence.say(text.splitlines()[0])
        others = [host for host in plan.hosts if host != config.current_host]
        said = _peer_notice(config, others, extra_s=stack_dump.REQUEST_WAIT_S + 2 * peers.WATCH_POLL_S)
        if said is not None and report.STALLED.match(said.notice):
            folder = forensics.folder(config.output_dir, "stacks")
            copied = [os.path.basename(path) for host in sorted(others, key=lambda h: h != said.host)
                      for path in peers.fetch_files(host, config.ports["presence"], folder)]
            return (f"{report.peer_failed(said.host, said.notice)}\n\nOn this host, {text}\nThe other hosts' stacks, "
                    f"copied into {folder}: {', '.join(copied) or 'none came'}\n")
    return text


def _prepare_forensics(config: job_config.JobConfig) -> None:
    """Before the job: an earlier run's forensics removed, the stack hook in site-packages
    (``stack_dump.ensure_hook``), the Flight Recorder's folder made; after it (at exit): the
    processes' registrations and the forensics folders it left empty removed."""
    forensics.clear(config.output_dir, stacks_dir(config))
    if not stack_dump.ensure_hook():
        log.warning("cannot write %s into site-packages: a stalled job's processes will not write their stacks",
                    stack_dump.PTH_NAME)
    os.makedirs(flight_recorder_dir(config), exist_ok=True)
    atexit.register(shutil.rmtree, stacks_dir(config), True)
    atexit.register(forensics.remove_empty, config.output_dir)


def run_job(plan_only: bool) -> int:
    """Runs (or with ``plan_only`` prints) this host's part of the job. Returns the exit code."""
    phase = _Phase("reading the job's configuration") if not plan_only else None
    oom_kills_before = memory.oom_kills()   # a SIGKILL during the job is the OOM killer's if this grows
    config = job_config.load()
    logging.getLogger().setLevel(config.log_level)
    unknown = sorted(k for k in config.framework_parameters if k not in FRAMEWORK_PARAMETERS | launchers.flags())
    if unknown:
        log.warning("ignoring hyperparameters this image does not read: %s", ", ".join(unknown))
    if config.channel_input_modes:
        log.info("channels (input mode): %s", ", ".join(f"{name} ({mode})"
                                                        for name, mode in config.channel_input_modes.items()))
    if config.cache_env:
        log.info("warm pool cache: %s", ", ".join(f"{name}={path}" for name, path in config.cache_env.items()))
    if phase:
        phase.current = "fetching the program and installing its dependencies"
    prog, plan = _plan_for(config, fetch=not plan_only)
    if plan_only:
        print(json.dumps({"current_host": config.current_host, **redact.redact_plan(plan.to_dict())}, indent=2))
        return 0
    report.clear_status(config.output_dir)
    _prepare_forensics(config)
    phase.current = "waiting for the other hosts"
    others = [h for h in plan.hosts if h != config.current_host]
    addresses: dict[str, str] = {}
    if others:   # fail in seconds, naming the host, when the cluster cannot form
        log.info("waiting for the names of %s to resolve", ", ".join(others))
        addresses = peers.wait_for_names(others, env_settings.seconds("DTC_HOST_RESOLVE_TIMEOUT_S", 120))
        log.info("other hosts resolve: %s", ", ".join(f"{h}={a}" for h, a in addresses.items()))
    log.info("host %s: strategy=%s role=%s master=%s (first of the sorted distribution hosts) hosts=%s "
             "world_size=%d ranks here=%s tasks here=%s", config.current_host, plan.strategy, plan.role,
             plan.master_host, ",".join(plan.hosts), plan.world_size, list(plan.ranks), list(plan.tasks))
    phase.current = "running the preflight"
    run_preflight(config, plan)
    phase.current = "waiting for the other hosts"   # the launcher's host part: the master's wait for their servers
    host_part = launchers.of(plan.strategy).host_part
    if host_part and (code := host_part(config, plan, prog.name)) is not None:
        return code
    phase.current = "starting the parameter servers"
    services = []
    watch = _peer_watch(plan, config.current_host, config.ports)
    presence = peers.Presence(config.ports["presence"]) if _has_presence(plan) else None
    try:
        try:
            services += [supervise.start_service(s.name, s.argv, s.env, plan.workdir) for s in plan.services]
            result = supervise.run(plan.argv, plan.env, plan.workdir, watch=watch, stall=_stall_rule(config, plan))
            if plan.end_notice:   # before the parameter servers close: the other hosts' cue
                peers.send_end_notice(plan.end_notice, 128 + result.signal_received if result.signal_received
                                      else result.exit_code)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):   # training has ended: a late stop changes nothing
                signal.signal(sig, signal.SIG_IGN)
            supervise.stop_services(services)
        if result.returncode == 0 and not result.signal_received:
            report.write_success(config.output_dir)
            log.info("training succeeded; model directory %s", config.model_dir)
            if presence is not None and not config.is_master:
                _hold_until_the_master_ends(config, plan)
            return 0
        signal_name = signal.Signals(result.signal_received).name if result.signal_received else None

        def account(peer_lost: str | None) -> str:
            return report.describe_failure(prog.name, result.exit_code, result.stderr_tail, signal_name,
                                           peers=_peer_names(plan, addresses), peer_lost=peer_lost,
                                           oom_killed=memory.oom_killed_since(oom_kills_before))
        text = account(result.peer_lost)
        lost = report.LOST_HOST.match(text)
        if result.stalled:
            text = _stall_account(config, plan, result, presence)
        elif presence is not None and lost and not signal_name and not result.peer_lost:
            # this host's ranks only saw host X go (Gloo), while X's train answered the watch: it may
            # still be saying why (its rank's signal or exception). A host the watch saw close or
            # stop answering has nothing more to say.
            said = _peer_notice(config, [lost.group(1)])
            if said is not None:
                text = account(report.peer_failed(said.host, said.notice))
        path = report.write_failure(config.output_dir, text)
        exit_code = (128 + result.signal_received if result.signal_received
                     else EXIT_STALLED if result.stalled or report.STALLED.match(result.peer_lost or text)
                     else EXIT_PEER_ERROR if result.peer_lost else result.exit_code)
        log.error("training failed (exit code %d): %s [details in %s]", exit_code, text.splitlines()[0], path)
        if presence is not None and not signal_name:   # the other hosts' watch reads this host's cause
            if result.stalled:   # and the master copies its ranks' stacks
                stacks = forensics.folder(config.output_dir, "stacks")
                presence.offer([os.path.join(stacks, name) for name in sorted(os.listdir(stacks))]
                               if os.path.isdir(stacks) else [])
            presence.fail(text.splitlines()[0], PRESENCE_LINGER_S)
        return exit_code or EXIT_INTERNAL_ERROR
    finally:
        if presence is not None:
            presence.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: ``train [--plan]``. Exits with the job's exit code."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [dtc] %(levelname)s %(message)s", stream=sys.stderr)
    output_dir = os.path.join(job_config.base_dir_from(os.environ), "output")
    try:
        code = run_job(plan_only=args.plan)
    except ConfigError as error:
        report.write_failure(output_dir, f"{error}\n")
        log.error("%s", error)
        code = EXIT_CONFIG_ERROR
    except PeerError as error:
        report.write_failure(output_dir, f"{error}\n")
        log.error("%s", error)
        code = EXIT_PEER_ERROR
    except PreflightError as error:
        report.write_failure(output_dir, f"{error}\n")
        log.error("%s", str(error).splitlines()[0])
        code = EXIT_PREFLIGHT_ERROR
    except StoppedBeforeLaunch as stopped:
        report.write_failure(output_dir, f"{stopped}\n")
        log.warning("%s", stopped)
        code = 128 + stopped.signum
    except Exception as error:  # report it; never exit 0 after a failure
        text = f"Training entrypoint error: {type(error).__name__}: {error}\n\n{traceback.format_exc()}"
        report.write_failure(output_dir, text)
        log.error("%s", text)
        code = EXIT_INTERNAL_ERROR
    sys.stdout.flush()
    sys.exit(code)
