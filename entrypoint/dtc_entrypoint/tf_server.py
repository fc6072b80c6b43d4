"""A TensorFlow cluster task that only serves: a parameter server or a ParameterServerStrategy
worker (``tf.distribute.Server`` for the task ``TF_CONFIG`` names).

Started by ``launch_tf.parameter_server_plan``, never by the dispatcher process itself (which
does not import TensorFlow). Without ``--until-closed`` it serves until stopped (a service the
supervisor ends); with ``--until-closed HOST:PORT`` it first waits for that address to open
(``DTC_TF_SERVER_START_TIMEOUT_S``, default 600 s) and exits 0 once it has closed: the chief's
host closes its parameter server when training ends. Stopped (SIGTERM, SIGINT) while waiting for
the chief it exits ``128 + signal`` at once; once the chief is up it keeps serving until the
chief's host closes, since a stopped chief still runs steps and reads variables here to write
its checkpoint (``train`` kills it after the stop's grace period if the chief never closes).

With ``--end-port PORT`` it also listens there for the master's end notice
(``peers.send_end_notice``, sent before the master closes its parameter server) and exits with
what it says: 0 when the chief finished, 1 when it failed (``the chief on host H failed ...``),
and 3 (``host H stopped answering ...``) when the port closed with no notice within
``END_NOTICE_GRACE_S``: the master's host was lost, and training with it.

Usage: ``python -m dtc_entrypoint.tf_server [--until-closed HOST:PORT [--end-port PORT]]``.
"""

import argparse
import json
import logging
import os
import signal
import sys

from . import env_settings, peers, ps_job, report
from .errors import EXIT_INTERNAL_ERROR, EXIT_PEER_ERROR

log = logging.getLogger("dtc.tf_server")

END_NOTICE_GRACE_S = 10.0   # how long after the chief's port closed its notice may still come


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--until-closed", metavar="HOST:PORT", help="serve until this address closes")
    parser.add_argument("--end-port", type=int, metavar="PORT", help="with --until-closed: listen here for the "
                        "master's end notice, and exit as it says")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [tf_server] %(message)s", stream=sys.stderr)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    # TensorFlow as the trainers load it (tf-keras, without pandas: dtc_train.tf_env, first), also
    # where TF_USE_LEGACY_KERAS is not set (the host; the image sets it): Keras 3, which the server
    # never uses, and the scikit-learn, pandas and matplotlib it imports took 1.8 s more of every
    # server's start (5.6 against 3.8 s, 2026-12-06)
    # isort: off
    from dtc_train import tf_env  # noqa: F401, PLC0415  (only in this process)
    import tensorflow as tf  # noqa: PLC0415
    # isort: on

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # A worker runs the coordinator's functions concurrently: give it enough inter-op threads
    # (TensorFlow's parameter-server tutorial) even on a 2-core host.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(4, os.cpu_count() or 1))
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                                  protocol=resolver.rpc_layer or "grpc", config=config, start=True)
    log.info("serving %s:%d at %s", task["type"], task["index"], server.target)
    if not args.until_closed:
        # a service ends when `train` stops it (SIGTERM): TensorFlow's runtime may have taken the
        # signal over for its preemption notifier, so give it back its default action
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        server.join()
        return 0
    host, _, port = args.until_closed.rpartition(":")
    notice = peers.EndNoticeListener(args.end_port) if args.end_port else None
    timeout_s = env_settings.seconds(ps_job.START_TIMEOUT_VARIABLE, ps_job.START_TIMEOUT_S)
    chief_up = False

    def on_stop(signum, _frame):
        if not chief_up:
            log.info("stopped by %s before the chief's host came up", signal.Signals(signum).name)
            os._exit(128 + signum)
        log.warning("%s: serving until the chief's host %s closes (the chief writes the checkpoint)",
                    signal.Signals(signum).name, args.until_closed)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    peers.wait_for_ports([host], int(port), timeout_s, "the chief's parameter server",
                         f"raise {ps_job.START_TIMEOUT_VARIABLE}")
    chief_up = True
    log.info("the chief's host %s is up; serving until it closes", args.until_closed)
    peers.wait_until_closed(host, int(port))
    log.info("%s closed: training has ended", args.until_closed)
    code = 0
    if notice is not None:
        chief_code = notice.wait(END_NOTICE_GRACE_S)
        if chief_code is None:
            log.error("%s", report.lost_host(host, f"its parameter server ({args.until_closed}) closed and its train "
                                                   "never said that training had ended"))
            code = EXIT_PEER_ERROR
        elif chief_code != 0:
            log.error("%s", report.chief_failed(host, chief_code))
            code = EXIT_INTERNAL_ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # the server's threads never stop on their own; leave without joining them


if __name__ == "__main__":
    sys.exit(main())
