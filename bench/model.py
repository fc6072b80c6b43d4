"""A7: a latency-bandwidth (alpha-beta, Hockney) model of allreduce, fitted to A1, and what it
projects for data-parallel training on 8 to 512 GPUs, ring allreduce against a parameter server.

Costs of reducing M bytes over p workers, alpha the per-message latency, beta the link
bandwidth (bytes/s), both per worker link (Thakur, Rabenseifner and Gropp 2005; Patarasuk and
Yuan 2009 for the ring):

* ring allreduce: ``2(p-1) alpha + 2 (p-1)/p M / beta``: each worker sends and receives
  2(p-1)/p M, in 2(p-1) steps; the bandwidth term is nearly independent of p.
* parameter server with S servers sharded evenly, the servers sharing the workers' hosts
  (TF2's ``ParameterServerStrategy`` layout here: one ps task per host): each server receives p
  shards of M/S and sends them back, so the busiest link carries ``2 p M / S``:
  ``2 alpha + 2 p M / (S beta)``; with one ps per host of g GPUs, S = p/g and the bandwidth term
  is ``2 g M / beta``, g times the ring's.

Step time: ``compute + (1 - overlap) x allreduce``, ``overlap`` the fraction of communication
hidden behind the backward pass. Scaling efficiency = compute-only step / step.

Fitting: A1's horovod-mpi medians at 2 ranks, ``t = 2 alpha + M / beta`` (n = 2 in the ring
formula), by least squares. That describes this machine's loopback, not a cluster's network,
so the projections use two link models: the fitted one, and the Horovod paper's cluster
(Sergeev and Del Balso 2018: 25 Gb/s RoCE, Pascal GPUs, 88 % efficiency for Inception V3 and
ResNet-101 at 128 GPUs and about 90 % at 512). Everything assumed is in ``ASSUMPTIONS``.
"""

from collections.abc import Sequence

ASSUMPTIONS = {
    "model": "ResNet-101 gradients, 44.5 M float32 parameters (178 MB), as in the Horovod paper's benchmark",
    "gradient_bytes": 44.5e6 * 4,
    "compute_s": 0.50,             # one step of batch 64 on a Pascal P100, ~128 images/s (Horovod paper's setup)
    "gpus_per_host": 8,
    "overlap": 0.5,                # half the allreduce hidden behind backward (Horovod's and DDP's bucketing)
    "paper_link": {"name": "25 Gb/s RoCE (Horovod paper)", "alpha_s": 20e-6, "beta_bytes_per_s": 25e9 / 8 * 0.9},
    "paper_efficiency": {128: 0.88, 512: 0.90},
}
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``t = 2 alpha + M / beta`` (a 2-rank ring allreduce) to medians.
    Returns (alpha seconds, beta bytes/s).

    Raises:
        ValueError: fewer than two sizes, or a fit with no positive bandwidth.
    """
    if len(set(sizes_bytes)) < 2:
        raise ValueError("the fit needs at least two message sizes")
    n = len(sizes_bytes)
    mean_m, mean_t = sum(sizes_bytes) / n, sum(times_s) / n
    slope = sum((m - mean_m) * (t - mean_t) for m, t in zip(sizes_bytes, times_s, strict=True)) / \
        sum((m - mean_m) ** 2 for m in sizes_bytes)
    if slope <= 0:
        raise ValueError("allreduce time does not grow with the message size: no bandwidth to fit")
    intercept = mean_t - slope * mean_m
    return max(intercept, 0.0) / 2, 1 / slope


def ring_allreduce_s(p: int, size_bytes: float, alpha_s: float, beta: float) -> float:
    """Ring allreduce time of ``size_bytes`` over ``p`` workers."""
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * size_bytes / beta


def parameter_server_s(p: int, size_bytes: float, alpha_s: float, beta: float, gpus_per_host: int) -> float:
    """Push and pull of ``size_bytes`` through one parameter server per host (S = p / g)."""
    servers = max(1, p // gpus_per_host)
    return 2 * alpha_s + 2 * p * size_bytes / (servers * beta)


def projection(alpha_s: float, beta: float, assumptions: dict = ASSUMPTIONS,
               gpu_counts: Sequence[int] = GPU_COUNTS) -> list[dict]:
    """Step time (s) and scaling efficiency of ring allreduce and a parameter server per GPU count."""
    m, compute, overlap, g = (assumptions[k] for k in ("gradient_bytes", "compute_s", "overlap", "gpus_per_host"))
    rows = []
    for p in gpu_counts:
        ring = compute + (1 - overlap) * ring_allreduce_s(p, m, alpha_s, beta)
        ps = compute + (1 - overlap) * parameter_server_s(p, m, alpha_s, beta, g)
        rows.append({"gpus": p, "ring_step_s": ring, "ring_efficiency": compute / ring,
                     "ps_step_s": ps, "ps_efficiency": compute / ps})
    return rows
