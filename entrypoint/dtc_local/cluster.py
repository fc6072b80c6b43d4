"""A local SageMaker cluster: N containers ``algo-1``..``algo-N`` on a private network, each with
its own ``/opt/ml`` tree written the way the service writes it, all started with ``train``.

What it does, in order:

1. writes ``<job_dir>/<host>/`` for every host (``dtc_local.job_tree``: resourceconfig.json
   with ``instance_groups`` listing the current host first, as the service does;
   inputdataconfig.json; JSON-encoded hyperparameters with the ``sagemaker_*`` keys SDK v2
   writes for the chosen ``distribution``), and ``<job_dir>/docker-compose.yaml``;
2. starts the containers on a private network where every host has a static address and an
   ``/etc/hosts`` entry for every other host, so the hosts find each other by name without a
   DNS plugin (podman's CNI backend resolves no names on an ``--internal`` network): with
   Docker, ``docker compose up`` on that file (no ``--abort-on-container-exit``: SDK local
   mode's flag stops every host when the first one exits, aws/sagemaker-python-sdk v2
   ``local/image.py``); with podman, an ``--internal`` network with ``--subnet`` and one
   ``podman run --ip --add-host`` per host;
3. streams every host's output with a ``[algo-N]`` prefix (MPI lines also carry mpirun's rank
   tags, trainer lines ``[rank N]``);
4. once a host has failed, gives the others ``peer_grace_s`` to notice and exit on their own,
   then stops them (SIGTERM, then SIGKILL 10 s later), as the service ends a job whose host
   failed;
5. gathers each host's ``model/``, ``output/`` and failure file (they are bind mounts, so they
   are already in ``<job_dir>/<host>/``), writes ``<job_dir>/result.json`` and exits 0 only if
   every host exited 0 (else the master's code, or the first failing host's).

Usage: ``python -m dtc_local.cluster --image dtc:cpu --instance-count 2 --distribution mpi
--processes-per-host 2 --program builtin:pytorch -p epochs=10`` or ``--job-file job.json``
(same keys, underscores: image, instance_count, processes_per_host, distribution, program,
source_dir, hyperparameters, channels, sharded_channels, shard_weights, gpus, environment,
host_environment, host_cpus, subnet, peer_grace_s, checkpoint_dir, command, name).
``make cluster`` wraps it.
"""

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dtc_entrypoint import launchers

from . import job_tree

# "none" (no distribution: each host runs the program alone), or a launcher (dtc_entrypoint.launchers)
DISTRIBUTIONS = ("none", *(str(launcher.strategy) for launcher in launchers.distributed()))
NETWORK = "dtc-cluster"
DEFAULT_SUBNET = "10.213.37.0/24"
CONTAINER_ML = "/opt/ml"
# The entrypoint's waits for other hosts default to what a real cluster needs (instances that
# boot minutes apart); local containers start together, so a host that is not there within
# these times will not come, and the job fails in seconds naming it. The job's own
# ``environment`` overrides them.
LOCAL_TIMEOUTS_S = {"DTC_HOST_RESOLVE_TIMEOUT_S": 10, "DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S": 30,
                    "DTC_MPI_WORKER_START_TIMEOUT_S": 120, "DTC_TF_SERVER_START_TIMEOUT_S": 120,
                    "DTC_PREFLIGHT_WAIT_S": 60}
# Variables of the environment the cluster runs in that every container gets too, so that
# ``DTC_PREFLIGHT=off make cluster`` turns the preflight off (the job's ``environment`` wins).
PASSED_THROUGH = ("DTC_PREFLIGHT",)
STOP_TIMEOUT_S = 10
TRAIN_COMMAND = ("train",)
JOB_NAME = "dtc-cluster"


@dataclass(frozen=True)
class ClusterJob:
    """One local job.

    Attributes:
        image: the image every host runs.
        instance_count: hosts, named ``algo-1``..``algo-<instance_count>``.
        processes_per_host: written as ``sagemaker_mpi_num_of_processes_per_host`` (the toolkit
            applies it to every launcher).
        distribution: one of ``DISTRIBUTIONS``.
        program: ``sagemaker_program`` (``builtin:pytorch``, ``train.py``).
        source_dir: host directory mounted at ``/opt/ml/code`` (SDK local mode's ``local_code``).
        hyperparameters: the user's, JSON-encoded into hyperparameters.json like SDK v2.
        channels: channel name -> host directory, mounted read-only at ``/opt/ml/input/data/<name>``.
        sharded_channels: channels delivered ``ShardedByS3Key``: each host's tree gets its own
            part of the channel's files (``job_tree.host_part``) instead of the mount, and
            inputdataconfig.json says ``ShardedByS3Key``.
        shard_weights: sharded channel -> one count per host, to deal its files unevenly
            (``job_tree.host_part``'s ``weights``); a channel not named here is dealt evenly.
        gpus: ``none`` or ``all`` (every container sees every GPU).
        instance_type: resourceconfig's ``current_instance_type``.
        environment: variables set in every container (the estimator's ``environment``), on
            top of ``LOCAL_TIMEOUTS_S`` and ``PASSED_THROUGH``.
        host_environment: host -> variables set in that host's container only, on top of
            ``environment`` (one host given other settings, or a fault).
        host_cpus: host -> the CPUs its container may use (podman's and Docker's ``--cpus``, a CFS
            quota): a host made slow for real, as a straggler would be.
        subnet: the private network's IPv4 subnet; host ``algo-i`` gets its ``10 + i``-th address.
        peer_grace_s: seconds the other hosts get to exit on their own once one host has failed,
            before they are stopped.
        command: what each container runs: ``train``, or what a training job's
            ``ContainerEntrypoint`` + ``ContainerArguments`` say (SDK v3 with ``source_code``
            runs its own ``sm_train.sh`` from its ``sm_drivers`` channel). With a command of its
            own, hyperparameters.json holds only ``hyperparameters``, as SDK v3 writes it: no
            ``sagemaker_*`` keys, which are ``train``'s (``program``, ``distribution``, ``source_dir``
            and ``processes_per_host`` then do nothing).
        checkpoint_dir: a host directory mounted at ``/opt/ml/checkpoints`` of every host, kept
            between runs: what ``checkpoint_s3_uri`` gives a real job (every host's checkpoint
            directory synced to one S3 prefix and restored on a restart), to rehearse a stopped
            or spot-interrupted job resuming. ``None``: each host's tree has its own, new each run.
        name: ``None``: the network is ``dtc-cluster`` and the containers are named after their
            hosts (``algo-1``...). A name: the network is ``<name>`` and the containers
            ``<name>-algo-1``..., so clusters with different names (and subnets) run side by side
            on one machine. Inside every container the host names stay ``algo-N``.
    """

    image: str
    instance_count: int = 2
    processes_per_host: int = 1
    distribution: str = "mpi"
    program: str = "builtin:pytorch"
    source_dir: str | None = None
    hyperparameters: Mapping[str, object] = field(default_factory=dict)
    channels: Mapping[str, str] = field(default_factory=dict)
    sharded_channels: tuple[str, ...] = ()
    shard_weights: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    gpus: str = "none"
    instance_type: str = "ml.c5.xlarge"
    environment: Mapping[str, str] = field(default_factory=dict)
    host_environment: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    host_cpus: Mapping[str, float] = field(default_factory=dict)
    subnet: str = DEFAULT_SUBNET
    peer_grace_s: float = 30.0
    checkpoint_dir: str | None = None
    command: tuple[str, ...] = TRAIN_COMMAND
    name: str | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(f"algo-{i}" for i in range(1, self.instance_count + 1))

    @property
    def network(self) -> str:
        """The private network's name (and ``docker compose``'s project name)."""
        return self.name or NETWORK

    def container(self, host: str) -> str:
        """The container that runs ``host``."""
        return f"{self.name}-{host}" if self.name else host


def host_addresses(job: ClusterJob) -> dict[str, str]:
    """host -> static IPv4 address in ``job.subnet`` (``algo-1`` -> the 11th address).

    Raises:
        ValueError: the subnet is not an IPv4 network or is too small for the hosts.
    """
    network = ipaddress.IPv4Network(job.subnet)
    if network.num_addresses < 12 + job.instance_count:
        raise ValueError(f"subnet {job.subnet} is too small for {job.instance_count} hosts")
    return {host: str(network.network_address + 10 + i) for i, host in enumerate(job.hosts, start=1)}


def container_env(job: ClusterJob, host: str | None = None, environ: Mapping[str, str] = os.environ
                  ) -> dict[str, str]:
    """Variables a container gets: ``TRAINING_JOB_NAME`` (the service sets it in every training
    container; SDK v3's drivers read it), the local waits, ``PASSED_THROUGH`` from ``environ``,
    the job's own ``environment``, then ``host``'s own (``host_environment``)."""
    return {"TRAINING_JOB_NAME": JOB_NAME, **{k: str(v) for k, v in LOCAL_TIMEOUTS_S.items()},
            **{k: environ[k] for k in PASSED_THROUGH if k in environ},
            **{k: str(v) for k, v in job.environment.items()},
            **{k: str(v) for k, v in job.host_environment.get(host, {}).items()}}


def distribution_hyperparameters(job: ClusterJob) -> dict[str, object]:
    """The ``sagemaker_*`` keys SDK v2 writes for ``job.distribution`` (its launcher's
    ``sdk_hyperparameters`` and ``sdk_instance_type``; aws/sagemaker-python-sdk v2, ``fw_utils.py``
    and ``local/image.py``), plus the processes per host."""
    flags: dict[str, object] = {}
    if job.distribution != "none":
        launcher = launchers.of(job.distribution)
        flags.update(launcher.sdk_hyperparameters)
        if launcher.sdk_instance_type:
            flags["sagemaker_instance_type"] = job.instance_type
    return {**flags, "sagemaker_mpi_num_of_processes_per_host": job.processes_per_host}


def job_hyperparameters(job: ClusterJob) -> dict[str, object]:
    """hyperparameters.json: the ``sagemaker_*`` keys SDK v2 writes for ``train`` and the job's
    own, or only the job's when it runs a command of its own (``ClusterJob.command``)."""
    if job.command != TRAIN_COMMAND:
        return dict(job.hyperparameters)
    hyperparameters: dict[str, object] = {"sagemaker_program": job.program,
                                          "sagemaker_container_log_level": 20, "sagemaker_job_name": JOB_NAME,
                                          "sagemaker_region": "us-east-1"}
    if job.source_dir:
        hyperparameters["sagemaker_submit_directory"] = CONTAINER_ML + "/code"
    hyperparameters.update(distribution_hyperparameters(job))
    hyperparameters.update(job.hyperparameters)
    return hyperparameters


def write_trees(job: ClusterJob, job_dir: str) -> dict[str, str]:
    """Writes ``<job_dir>/<host>/`` for every host. Returns host -> tree."""
    unknown = sorted(set(job.sharded_channels) - set(job.channels))
    if unknown:
        raise ValueError(f"sharded_channels names {unknown}, which are not among the channels {sorted(job.channels)}")
    unsharded = sorted(set(job.shard_weights) - set(job.sharded_channels))
    if unsharded:
        raise ValueError(f"shard_weights names {unsharded}, which are not among the sharded_channels "
                         f"{sorted(job.sharded_channels)}")
    trees = {}
    for index, host in enumerate(job.hosts):
        trees[host] = job_tree.write(
            os.path.join(job_dir, host), hyperparameters=job_hyperparameters(job), channels=tuple(job.channels),
            hosts=job.hosts, current_host=host, instance_type=job.instance_type,
            sharded_channels=job.sharded_channels)
        for name in job.sharded_channels:
            job_tree.host_part(job.channels[name], os.path.join(trees[host], "input", "data", name),
                               job.instance_count, index, job.shard_weights.get(name))
    return trees


def volumes(job: ClusterJob, tree: str) -> list[str]:
    """``host_path:container_path[:ro]`` mounts of one host: its tree, the channels, the code."""
    mounts = [f"{tree}:{CONTAINER_ML}"]
    mounts += [f"{os.path.abspath(path)}:{CONTAINER_ML}/input/data/{name}:ro" for name, path in job.channels.items()
               if name not in job.sharded_channels]
    if job.source_dir:
        mounts.append(f"{os.path.abspath(job.source_dir)}:{CONTAINER_ML}/code")
    if job.checkpoint_dir:
        mounts.append(f"{os.path.abspath(job.checkpoint_dir)}:{CONTAINER_ML}/checkpoints")
    return mounts


def compose_file(job: ClusterJob, trees: Mapping[str, str]) -> dict:
    """The ``docker compose`` project (SDK local mode's shape, minus its shared model volume:
    every host keeps its own ``/opt/ml``, as on the service)."""
    addresses = host_addresses(job)
    services = {}
    for host, tree in trees.items():
        service = {"image": job.image, "container_name": job.container(host), "hostname": host,
                   "command": list(job.command),
                   "shm_size": "1gb", "volumes": volumes(job, tree), "environment": container_env(job, host),
                   "extra_hosts": [f"{h}:{a}" for h, a in addresses.items()],
                   "networks": {job.network: {"ipv4_address": addresses[host]}}}
        if host in job.host_cpus:
            service["cpus"] = job.host_cpus[host]
        if job.gpus == "all":
            gpus = [{"count": "all", "capabilities": ["gpu"]}]
            service["deploy"] = {"resources": {"reservations": {"devices": gpus}}}
        services[host] = service
    network = {"name": job.network, "internal": True, "ipam": {"config": [{"subnet": job.subnet}]}}
    return {"services": services, "networks": {job.network: network}}


def podman_run_argv(job: ClusterJob, host: str, tree: str) -> list[str]:
    """``podman run`` for one host: static address, an ``/etc/hosts`` entry per host, its mounts."""
    addresses = host_addresses(job)
    argv = ["podman", "run", "--rm", "--name", job.container(host), "--hostname", host, "--network", job.network,
            "--ip", addresses[host], "--shm-size", "1g"]
    for other, address in addresses.items():
        argv += ["--add-host", f"{other}:{address}"]
    for name in container_env(job, host):
        argv += ["--env", name]   # values from the environment podman runs in: none on a command line
    if host in job.host_cpus:
        argv += ["--cpus", str(job.host_cpus[host])]
    for mount in volumes(job, tree):
        argv += ["-v", mount]
    if job.gpus == "all":
        argv += ["--device", "nvidia.com/gpu=all"]   # CDI (nvidia-ctk cdi generate)
    return argv + [job.image, *job.command]


def _pump(prefix: str, stream, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        with lock:
            sys.stdout.write(f"[{prefix}] {line}\n")
            sys.stdout.flush()
    stream.close()


def docker_cli() -> str:
    """The Docker CLI: ``$DOCKER`` (scripts/docker-daemon.sh env names Debian's), else ``docker``."""
    return os.environ.get("DOCKER") or "docker"


def docker_available() -> bool:
    """A Docker daemon answers (``DOCKER_HOST``, else Docker's default socket)."""
    return shutil.which(docker_cli()) is not None and subprocess.run(
        [docker_cli(), "info"], capture_output=True).returncode == 0


def compose_command() -> list[str]:
    """``docker compose`` (v2, a CLI plugin) where the CLI has it, else ``docker-compose`` (1.29,
    Debian's package), which reads the same file (the Compose Specification)."""
    if subprocess.run([docker_cli(), "compose", "version"], capture_output=True).returncode == 0:
        return [docker_cli(), "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SystemExit("cluster: Docker runs but has no compose client: install Docker's compose plugin or "
                     "docker-compose, or use --engine podman")


def run_podman(job: ClusterJob, trees: Mapping[str, str], timeout_s: float) -> dict[str, int]:
    """Runs the hosts as podman containers; returns host -> exit code (124 for a timeout).

    Raises:
        SystemExit: the private network cannot be created (a subnet clash names ``--subnet``).
    """
    for host in job.hosts:
        subprocess.run(["podman", "rm", "-f", job.container(host)], capture_output=True)
    subprocess.run(["podman", "network", "rm", "-f", job.network], capture_output=True)
    created = subprocess.run(["podman", "network", "create", "--internal", "--subnet", job.subnet, job.network],
                             capture_output=True, text=True)
    if created.returncode != 0:
        raise SystemExit(f"cluster: cannot create the network {job.network} with subnet {job.subnet} "
                         f"(choose another with --subnet or the job file's \"subnet\"): {created.stderr.strip()}")
    lock = threading.Lock()
    procs, pumps = {}, []
    try:
        for host in job.hosts:
            procs[host] = subprocess.Popen(podman_run_argv(job, host, trees[host]), stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env={**os.environ, **container_env(job, host)})
            pumps.append(threading.Thread(target=_pump, args=(host, procs[host].stdout, lock), daemon=True))
            pumps[-1].start()
        return supervise_hosts(procs, timeout_s, job.peer_grace_s,
                               stop=lambda host: _podman_stop(job.container(host)))
    finally:
        for host, proc in procs.items():
            if proc.poll() is None:
                subprocess.run(["podman", "kill", job.container(host)], capture_output=True)
                proc.wait()
        for pump in pumps:
            pump.join(timeout=10)
        subprocess.run(["podman", "network", "rm", "-f", job.network], capture_output=True)


def _podman_stop(container: str) -> None:
    subprocess.run(["podman", "stop", "-t", str(STOP_TIMEOUT_S), container], capture_output=True)


def supervise_hosts(procs: Mapping[str, subprocess.Popen], timeout_s: float, peer_grace_s: float,
                    stop: Callable[[str], None], poll_s: float = 0.5,
                    clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Waits for every host's process; returns host -> exit code.

    Once a host has exited non-zero, the others get ``peer_grace_s`` seconds to exit on their
    own (and write their own failure), then ``stop(host)`` ends them, as SageMaker ends the other
    instances of a job whose host failed. At ``timeout_s`` every host still running is stopped
    and reported as 124.
    """
    deadline = clock() + timeout_s
    failed_at: float | None = None
    codes: dict[str, int] = {}
    while len(codes) < len(procs):
        for host, proc in procs.items():
            if host not in codes and (code := proc.poll()) is not None:
                codes[host] = code
                if code != 0 and failed_at is None:
                    failed_at = clock()
        running = [h for h in procs if h not in codes]
        timed_out = clock() > deadline
        if running and (timed_out or (failed_at is not None and clock() > failed_at + peer_grace_s)):
            for host in running:
                stop(host)
            for host in running:
                code = procs[host].wait()
                codes[host] = 124 if timed_out else code
        elif running:
            time.sleep(poll_s)
    return {host: codes[host] for host in procs}


def run_compose(job: ClusterJob, compose_path: str, timeout_s: float) -> dict[str, int]:
    """Runs the project with ``compose_command``; returns host -> exit code (124 for a timeout),
    read from each container's state (``docker inspect``), which every compose client leaves."""
    base = [*compose_command(), "-f", compose_path, "-p", job.network]
    subprocess.run(base + ["down", "--remove-orphans"], capture_output=True)   # a run before this one
    timed_out = False
    try:
        subprocess.run(base + ["up", "--no-color"], timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        subprocess.run(base + ["kill"])
    codes = {}
    for host in job.hosts:
        state = subprocess.run([docker_cli(), "inspect", "--format", "{{.State.ExitCode}}", job.container(host)],
                               capture_output=True, text=True)
        codes[host] = 124 if timed_out else int(state.stdout.strip()) if state.returncode == 0 else 1
    subprocess.run(base + ["down"], capture_output=True)
    return codes


def summarize(job: ClusterJob, trees: Mapping[str, str], codes: Mapping[str, int]) -> dict:
    """host -> exit code, first failure line, model and output files (relative to the tree)."""
    hosts = {}
    for host, tree in trees.items():
        failure_path = os.path.join(tree, "output", "failure")
        failure = open(failure_path).read().splitlines()[:1] if os.path.exists(failure_path) else []
        listing = {}
        for sub in ("model", "output"):
            root = os.path.join(tree, sub)
            listing[sub] = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
                                  for f in files if "/.tmp-" not in os.path.join(d, f))
        hosts[host] = {"exit_code": codes[host], "failure": failure[0] if failure else None, **listing}
    failed = [h for h in job.hosts if codes[h] != 0]
    exit_code = 0 if not failed else (codes[job.hosts[0]] or codes[failed[0]])
    return {"exit_code": exit_code, "distribution": job.distribution, "image": job.image, "hosts": hosts}


def run(job: ClusterJob, job_dir: str, timeout_s: float = 3600, engine: str = "auto") -> dict:
    """Writes the trees, runs the cluster and returns the summary (also in ``result.json``)."""
    job_dir = os.path.abspath(job_dir)
    os.makedirs(job_dir, exist_ok=True)
    trees = write_trees(job, job_dir)
    if job.checkpoint_dir:
        os.makedirs(job.checkpoint_dir, exist_ok=True)
    compose_path = os.path.join(job_dir, "docker-compose.yaml")
    with open(compose_path, "w") as handle:
        json.dump(compose_file(job, trees), handle, indent=2)   # JSON is YAML
    use_docker = engine == "docker" or (engine == "auto" and docker_available())
    runner = " ".join(compose_command()) if use_docker else "podman"
    print(f"local cluster: {job.instance_count} hosts x {job.processes_per_host} processes, distribution "
          f"{job.distribution}, image {job.image}, with {runner}; trees in {job_dir}", flush=True)
    codes = run_compose(job, compose_path, timeout_s) if use_docker else run_podman(job, trees, timeout_s)
    summary = summarize(job, trees, codes)
    with open(os.path.join(job_dir, "result.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    for host, info in summary["hosts"].items():
        print(f"{host}: exit {info['exit_code']}; model: {', '.join(info['model']) or '-'}"
              + (f"; failure: {info['failure']}" if info["failure"] else ""), flush=True)
    return summary


def _job_from(args: argparse.Namespace) -> ClusterJob:
    spec: dict = {}
    if args.job_file:
        with open(args.job_file) as handle:
            spec = json.load(handle)
    for key in ("image", "instance_count", "processes_per_host", "distribution", "program", "source_dir", "gpus",
                "subnet", "checkpoint_dir", "name"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    hyperparameters = dict(spec.get("hyperparameters", {}))
    for item in args.hyperparameter:
        key, _, value = item.partition("=")
        hyperparameters[key] = job_tree._parse_value(value)
    spec["hyperparameters"] = hyperparameters
    channels = dict(spec.get("channels", {}))
    for item in args.channel:
        name, _, path = item.partition("=")
        channels[name] = path
    spec["channels"] = channels
    if "command" in spec:
        spec["command"] = tuple(spec["command"])
    weights = {name: tuple(counts) for name, counts in spec.get("shard_weights", {}).items()}
    sharded = list(spec.get("sharded_channels", ()))
    for item in args.sharded_channel:
        name, _, counts = item.partition(":")
        sharded.append(name)
        if counts:
            try:
                weights[name] = tuple(int(count) for count in counts.split(","))
            except ValueError:
                raise SystemExit(f"cluster: --sharded-channel {item}: the weights after ':' are whole numbers, "
                                 "one per host (training:3,1)") from None
    spec["sharded_channels"], spec["shard_weights"] = tuple(sharded), weights
    if "image" not in spec:
        raise SystemExit("cluster: no image: pass --image or set \"image\" in the job file")
    if spec.get("distribution", "mpi") not in DISTRIBUTIONS:
        raise SystemExit(f"cluster: distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                         f"got {spec['distribution']!r}")
    return ClusterJob(**spec)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-file", help="JSON with the keys below (flags override it)")
    parser.add_argument("--image")
    parser.add_argument("--instance-count", type=int)
    parser.add_argument("--processes-per-host", type=int)
    parser.add_argument("--distribution", choices=DISTRIBUTIONS)
    parser.add_argument("--program", help="sagemaker_program (default builtin:pytorch)")
    parser.add_argument("--source-dir", help="directory mounted at /opt/ml/code")
    parser.add_argument("--gpus", choices=("none", "all"))
    parser.add_argument("--subnet", help=f"the private network's IPv4 subnet (default {DEFAULT_SUBNET})")
    parser.add_argument("--name", help="the cluster's name: network <name>, containers <name>-algo-N (default: "
                                           f"network {NETWORK}, containers algo-N); clusters of different names "
                                           "and subnets run side by side")
    parser.add_argument("--checkpoint-dir", help="directory mounted at /opt/ml/checkpoints on every host and kept "
                                                 "between runs (what checkpoint_s3_uri does): a rerun resumes from it")
    parser.add_argument("-p", "--hyperparameter", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--channel", action="append", default=[], metavar="NAME=DIR",
                        help="a channel (default: the --data set as training and validation)")
    parser.add_argument("--data", choices=("digits", "photos"), default="digits",
                        help="the data set exported to <job-dir>/data-<name> when no channel is given: digits "
                             "(8x8 grayscale, dtc_train.digits) or photos (RGB crops of sample photographs, "
                             "dtc_train.photos)")
    parser.add_argument("--sharded-channel", action="append", default=[], metavar="NAME[:W1,W2,...]",
                        help="deliver this channel ShardedByS3Key: each host gets its part of the files, dealt in "
                             "turn, or W1 files to the first host for every W2 to the second... (training:3,1)")
    parser.add_argument("--job-dir", default="build/cluster")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--engine", choices=("auto", "docker", "podman"), default="auto")
    args = parser.parse_args(argv)
    job = _job_from(args)
    if not job.channels:
        from dtc_train import digits, photos  # noqa: PLC0415

        dataset = {"digits": digits, "photos": photos}[args.data]
        data = os.path.join(os.path.abspath(args.job_dir), f"data-{args.data}")
        if not os.path.isdir(os.path.join(data, "validation")):
            dataset.export(data)
        job = ClusterJob(**{**job.__dict__, "channels": {c: os.path.join(data, c) for c in dataset.CHANNELS}})
    summary = run(job, args.job_dir, args.timeout_s, args.engine)
    sys.exit(summary["exit_code"])


if __name__ == "__main__":
    main()
