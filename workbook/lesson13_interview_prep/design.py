"""The system-design question, worked end to end, and a grader for your own answer.

The question (an article about a training "protocol", with interview questions): *design a
training system for 1,000 nodes x 8 GPUs, tolerating 5 % node failures, completing 100
training runs a day, 50B parameters; graded on communication topology (40 %), checkpoint
strategy (30 %), resource scheduling (30 %).*

Every number here is computed: the layout by :func:`simcluster.planner.search`, step time
and traffic by the planner's cost model (NCCL's, as the simulator charges), checkpoint
times from the node's storage, host and network specs (:mod:`simcluster.spec`), the
interval and goodput by Young's and Daly's formulas (:mod:`simcluster.goodput`), and the
day's 100 runs by lesson 11's scheduling simulator with node failures and restarts
(:func:`simcluster.scheduling.simulate`). What the question leaves open is a named
assumption (:class:`Scenario`).

* :func:`budget`: what "100 runs a day" can mean, in GPU-hours and tokens per run;
* :func:`best_layout`, :func:`traffic`: the layout of one run and its bytes per tier;
* :func:`failure_rates`, :func:`checkpoint_tiers`: failures per day and job MTBF, and what a
  checkpoint costs in host memory, on NVMe and on a remote file system;
* :func:`run_day`: the day's runs on the scheduler, with failures and spares;
* :func:`evaluate` and :func:`check_design`: a design dict graded 40/30/30, with what each
  choice cost.
"""

import math
from dataclasses import dataclass, field, replace

from simcluster import goodput, planner, scheduling
from simcluster import spec as _spec

DAY = 86400.0
HORIZON = 3 * DAY            # the day's runs are simulated until all end, or 3 days

# A 50B-class GPT: 60 layers of hidden 8,192 (64 heads of 128), Llama 3's vocabulary of
# 128,256 with an untied output layer, 4,096-token sequences: 50.4 B parameters.
MODEL = planner.TransformerConfig(layers=60, hidden=8192, heads=64, seq_len=4096,
                                  vocab=128256, tied_embeddings=False)
GLOBAL_BATCH = 1024          # sequences per step: 4.2 M tokens, as Llama 3's early phase

# docs/reference-numbers.md, "Failures": Llama 3 405B saw 419 unexpected interruptions
# in 54 days on 16,384 H100s (2,048 nodes of 8).
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_NODES = 419, 54, 2048
LLAMA3_RATE = LLAMA3_INTERRUPTIONS / LLAMA3_DAYS / LLAMA3_NODES   # per node per day
# ... and checkpointed to Tectonic, 2 TB/s sustained (shared by every job that writes).
REMOTE_BANDWIDTH = 2e12
# Bytes per parameter a checkpoint keeps: bf16 weights (2) + fp32 master weights, Adam's
# momentum and variance (12); gradients are not saved.
CHECKPOINT_BYTES_PER_PARAMETER = 14
NODES_PER_SWITCH_GROUP = 32  # a DGX SuperPOD scalable unit: 32 nodes under 8 rail leaves
# Rails are non-blocking inside a unit; the spine that joins units is assumed tapered 4:1
# (few runs should need it): a run placed across units gets a quarter of the network.
SPINE_OVERSUBSCRIPTION = 4
# An H100 80GB shows 81,559 MiB (79.65 GiB) to CUDA, of the 80 GiB the planner counts, and
# the CUDA context, NCCL's buffers and the caching allocator's fragmentation take more:
# a plan keeps this share of the device free (72 GiB of 80 usable).
MEMORY_HEADROOM = 0.10
TIERS = ("memory", "nvme", "remote")
PLACEMENTS = tuple(scheduling.PLACEMENTS)
RUBRIC = {"topology": 40, "checkpoint": 30, "scheduling": 30}
LAYOUT_POINTS = 25           # of topology's 40; a topology-aware placement earns the rest
PASS_SCORE = 90              # of 100: what the lab's check calls a good answer


@dataclass(frozen=True)
class Scenario:
    """The question's numbers and the assumptions it leaves open.

    ``tokens_per_run`` is an assumption (the question gives none): 5 B tokens, a
    fine-tuning or ablation run, 1/200 of the 1 T a 50B model needs to be trained
    Chinchilla-optimally (20 tokens per parameter). ``repair_hours`` (a failed node
    drained, diagnosed and swapped), ``swap_minutes`` (a hot spare brought in) and
    ``restart_minutes`` (a 64-GPU job relaunched: the failure detected, the gang
    rescheduled, containers and NCCL started; 5 minutes, within lesson 10's 1 to 10, as
    lesson 11 charges) are assumptions too; reading the checkpoint back comes on top.
    """

    nodes: int = 1000
    gpus_per_node: int = 8
    runs: int = 100
    failures_per_node_per_day: float = 0.05
    tokens_per_run: float = 5e9
    repair_hours: float = 6.0
    swap_minutes: float = 10.0
    restart_minutes: float = 5.0
    node: str = "dgx-h100"
    seed: int = 0

    def spec(self, nodes=None):
        """The cluster, or ``nodes`` nodes of it."""
        return _spec.preset(self.node, nodes=nodes or self.nodes)


QUESTION = Scenario()


# ------------------------------------------------------------ 1. what the day asks


def budget(scenario=QUESTION, layout=None):
    """What "``runs`` a day" means on the cluster: GPU-hours a day, the share of one run,
    and the tokens that share trains at ``layout``'s throughput (default: the best layout
    on ``nodes / runs`` nodes)."""
    s = scenario
    gpus = s.nodes * s.gpus_per_node
    layout = layout or best_layout(max(1, s.nodes // s.runs), s)
    per_gpu = tokens_per_second(layout) / layout.gpus
    share = gpus * 24 / s.runs
    return {"gpu_hours_per_day": gpus * 24, "gpu_hours_per_run": share,
            "tokens_per_run_at_share": share * 3600 * per_gpu,
            "tokens_per_gpu_second": per_gpu,
            "chinchilla_tokens": 20 * planner.parameter_count(MODEL)}


def tokens_per_second(est):
    """Tokens a layout trains per second (all its GPUs)."""
    return est.global_batch * MODEL.seq_len / est.step_time


# ----------------------------------------------------------------- 2. the layout


def fits(est):
    """Whether a layout leaves :data:`MEMORY_HEADROOM` of the device free (the planner's
    own ``fits`` allows every byte of it)."""
    return est.memory_per_gpu <= (1 - MEMORY_HEADROOM) * est.device_memory


def best_layout(nodes, scenario=QUESTION, **constraints):
    """The fastest layout of one run on ``nodes`` nodes (:func:`planner.search`) that
    keeps the headroom (:func:`fits`), or None if none does."""
    found = planner.search(MODEL, scenario.spec(nodes), global_batch=GLOBAL_BATCH,
                           **constraints)
    return next((est for est in found if fits(est)), None)


def layout_of(design, scenario=QUESTION):
    """The planner's :class:`~simcluster.planner.Estimate` of a design's layout (raises
    ValueError for one the planner refuses, naming why)."""
    nodes = design["nodes_per_run"]
    gpus = nodes * scenario.gpus_per_node
    tp, pp = design["tp"], design["pp"]
    if gpus % (tp * pp):
        raise ValueError(f"tp x pp = {tp * pp} does not divide the run's {gpus} GPUs")
    return planner.estimate(MODEL, scenario.spec(nodes), tp=tp, pp=pp, dp=gpus // (tp * pp),
                            global_batch=GLOBAL_BATCH, micro_batch=design.get("micro_batch"),
                            recompute=design.get("recompute", "selective"),
                            zero=design.get("zero", 1))


def _span(ranks, per_node):
    return len({r // per_node for r in ranks})


def traffic(est, per_node=8):
    """Bytes each GPU sends per step, by parallelism and by tier (NVLink inside a node,
    InfiniBand between nodes), with the seconds the planner charges for them.

    Megatron-LM's tensor parallelism all-reduces the activations (``b·s·h`` 16-bit values)
    twice in each layer's forward and twice in its backward; a ring all-reduce sends
    ``2(t-1)/t`` of the data from each GPU. The pipeline sends each micro-batch's
    activations forward and their gradients back, ``1/t`` per tensor-parallel rank.
    Data parallelism reduce-scatters the 16-bit gradients and all-gathers the 16-bit
    weights (ZeRO 1-2; an all-reduce moves the same bytes): ``(d-1)/d`` of the shard's
    bytes each, ``2(d-1)/d`` in all, of 2 bytes per parameter of the GPU's shard. A ring
    over ranks on ``k`` nodes crosses the network on ``k`` of its hops: that share of its
    bytes goes over InfiniBand.
    """
    t, p, d, b, m = est.tp, est.pp, est.dp, est.micro_batch, est.micro_batches
    act = b * MODEL.seq_len * MODEL.hidden * 2
    layers = MODEL.layers // p
    tp_bytes = m * layers * 4 * 2 * (t - 1) / t * act if t > 1 else 0.0
    pp_bytes = m * 2 * act / t if p > 1 else 0.0
    shard = max(planner._stage_parameters(MODEL, p, t)) * 2    # bytes, 16-bit
    dp_bytes = 2 * (d - 1) / d * shard if d > 1 else 0.0
    # ranks: tensor-parallel fastest, then data, then pipeline (the planner's order)
    tp_nodes = _span(range(t), per_node)
    dp_nodes = _span([i * t for i in range(d)], per_node)
    pp_nodes = _span([i * t * d for i in range(p)], per_node)
    rows = {}
    for name, nbytes, group, nodes, seconds in (
            ("tensor", tp_bytes, t, tp_nodes, est.breakdown["tp_communication"]),
            ("pipeline", pp_bytes, p, pp_nodes, est.breakdown["pp_communication"]),
            ("data", dp_bytes, d, dp_nodes, est.breakdown["dp_communication"])):
        share = 0.0 if nodes == 1 else (1.0 if name == "pipeline" else nodes / group)
        rows[name] = {"bytes": nbytes, "ib_bytes": nbytes * share,
                      "nvlink_bytes": nbytes * (1 - share), "seconds": seconds,
                      "nodes": nodes}
    return rows


# ----------------------------------------------------------- 3. failures, checkpoints


def failure_rates(nodes_per_run, scenario=QUESTION):
    """Failures a day on the cluster and the MTBF of one run's gang: the question's rate
    and Llama 3's measured one."""
    s = scenario
    return {"question_per_day": s.nodes * s.failures_per_node_per_day,
            "llama3_per_day": s.nodes * LLAMA3_RATE,
            "llama3_rate": LLAMA3_RATE,
            "ratio": s.failures_per_node_per_day / LLAMA3_RATE,
            "job_mtbf": goodput.job_mtbf(nodes_per_run, s.failures_per_node_per_day),
            "job_mtbf_llama3": goodput.job_mtbf(nodes_per_run, LLAMA3_RATE)}


def checkpoint_tiers(nodes_per_run, scenario=QUESTION):
    """``{tier: {"bytes", "delta", "restore"}}``: a run's checkpoint, the seconds training
    stops to write it, and the seconds a restart spends reading it back (plus the
    relaunch itself, the scenario's ``restart_minutes``).

    * ``memory``: each GPU copies its shard to host memory over PCIe (training stops for
      that only), then the host sends it to a peer node's memory over the node's NICs,
      in the background (Gemini, SOSP'23): a failed node's shard survives on its peer.
    * ``nvme``: each node writes its ranks' shards to its NVMe array
      (``torch.distributed.checkpoint`` with the file-system writer, at the array's
      bandwidth as the simulator's storage charges it) and copies them to a peer's.
    * ``remote``: the shards go to a shared file system; every run writes at once, so each
      gets ``1/runs`` of its bandwidth (Llama 3's Tectonic: 2 TB/s sustained).
    """
    s = scenario
    node = s.spec(1).nodes[0]
    total = CHECKPOINT_BYTES_PER_PARAMETER * planner.parameter_count(MODEL)
    gpus = nodes_per_run * s.gpus_per_node
    per_gpu, per_node = total / gpus, total / nodes_per_run
    pcie = node.host.link.bandwidth * node.host.link.efficiency
    nics = s.spec(1).network.nic
    network = node.nics * nics.bandwidth * nics.efficiency
    remote = REMOTE_BANDWIDTH / s.runs
    relaunch = s.restart_minutes * 60.0
    return {
        "memory": {"bytes": total, "delta": per_gpu / pcie,
                   "restore": relaunch + per_node / network},
        "nvme": {"bytes": total, "delta": node.storage.write_seconds(per_node),
                 "restore": relaunch + node.storage.read_seconds(per_node)},
        "remote": {"bytes": total, "delta": total / remote,
                   "restore": relaunch + total / remote},
    }


# ------------------------------------------------------------- 4. the day's runs


def run_day(design, scenario=QUESTION, compute_seconds=None, delta=0.0, restore=0.0,
            crossing_slowdown=1.0):
    """The day's ``runs`` jobs on the scheduler: all submitted at midnight, each a gang of
    ``nodes_per_run`` whole nodes that needs ``compute_seconds`` of training plus a
    checkpoint of ``delta`` every ``checkpoint_minutes`` (``crossing_slowdown`` times
    longer when it is placed across scalable units, on the tapered spine); nodes fail at
    the scenario's rate (:func:`~simcluster.scheduling.node_failures`), the run on a failed
    node loses the work since its last checkpoint and queues again (``restore`` seconds to
    restart); ``spare_nodes`` are held outside the scheduler and swapped in for failed
    nodes. Returns the :class:`~simcluster.scheduling.Result`."""
    s = scenario
    active = s.nodes - design["spare_nodes"]
    tau = design["checkpoint_minutes"] * 60.0
    wall = compute_seconds * (1 + delta / tau)       # checkpoints stop training too
    nodes = design["nodes_per_run"]
    switches = [list(range(i, min(i + NODES_PER_SWITCH_GROUP, active)))
                for i in range(0, active, NODES_PER_SWITCH_GROUP)]

    def duration(placement):
        crosses = scheduling.spans(placement, switches)[1] > 1
        return round(wall * (crossing_slowdown if crosses else 1.0))

    jobs = [scheduling.Job(f"run{i:03d}", nodes * s.gpus_per_node, duration,
                           gpus_per_node=s.gpus_per_node, checkpoint_every=tau + delta,
                           restart_cost=restore)
            for i in range(s.runs)]
    failures = scheduling.node_failures(active, s.failures_per_node_per_day, HORIZON,
                                        s.repair_hours * 3600.0, spares=design["spare_nodes"],
                                        swap=s.swap_minutes * 60.0, seed=s.seed)
    return scheduling.simulate(jobs, s.spec(active), policy="fifo",
                               placement=design["placement"], backfill=True,
                               switches=switches, failures=failures, until=HORIZON)


def crossing_slowdown(est, scenario=QUESTION):
    """How much longer a step of ``est``'s layout takes when its run spans scalable units:
    the planner's step time with the network shared :data:`SPINE_OVERSUBSCRIPTION` ways,
    over its step time inside one unit."""
    spec = scenario.spec(est.gpus // scenario.gpus_per_node)
    tapered = replace(spec, network=replace(spec.network,
                                            oversubscription=SPINE_OVERSUBSCRIPTION))
    slow = planner.estimate(MODEL, tapered, tp=est.tp, pp=est.pp, dp=est.dp,
                            global_batch=est.global_batch, micro_batch=est.micro_batch,
                            recompute=est.recompute, zero=est.zero)
    return slow.step_time / est.step_time


def keeps_units(placement, scenario=QUESTION):
    """``(True, "")`` if the placement rule named ``placement`` puts a run inside one
    scalable unit when one has room, else ``(False, what it did)``: a probe where the
    lowest-numbered free nodes straddle two units and the next unit has room."""
    per_node, nodes = scenario.gpus_per_node, 4 * NODES_PER_SWITCH_GROUP
    gang = 8
    free = [0] * nodes
    straddle = range(NODES_PER_SWITCH_GROUP - gang // 2, NODES_PER_SWITCH_GROUP + gang // 2)
    roomy = range(2 * NODES_PER_SWITCH_GROUP + 4, 2 * NODES_PER_SWITCH_GROUP + 4 + gang)
    for n in (*straddle, *roomy):
        free[n] = per_node
    switches = [list(range(i, i + NODES_PER_SWITCH_GROUP))
                for i in range(0, nodes, NODES_PER_SWITCH_GROUP)]
    topo = scheduling.Topology([per_node] * nodes, switches)
    taken = scheduling.PLACEMENTS[placement](free, gang * per_node, per_node, topo)
    units = sorted({n // NODES_PER_SWITCH_GROUP for n in taken or ()})
    if len(units) == 1:
        return True, ""
    return False, (f"with nodes {straddle[0]}-{straddle[-1]} (two units) and "
                   f"{roomy[0]}-{roomy[-1]} (one unit) free, it placed an {gang}-node run "
                   f"across units {', '.join(map(str, units))}")


# ----------------------------------------------------------------- 5. grading


KEYS = {"nodes_per_run": "nodes per run (an integer)", "tp": "tensor-parallel size",
        "pp": "pipeline-parallel size", "zero": "ZeRO stage 0-3",
        "recompute": "'none', 'selective' or 'full'",
        "checkpoint_tier": f"one of {', '.join(TIERS)}",
        "checkpoint_minutes": "minutes of training between checkpoints",
        "spare_nodes": "hot spare nodes held outside the scheduler",
        "placement": f"one of {', '.join(PLACEMENTS)}"}
OPTIONAL = {"micro_batch": "micro-batch size (default: the planner's best)"}


def validate(design, scenario=QUESTION):
    """Raise ValueError naming the first thing wrong with ``design``'s form (a missing or
    unknown key, a value of the wrong kind); the grade judges the rest."""
    if not isinstance(design, dict):
        raise ValueError(f"a design is a dict with keys {', '.join(KEYS)}; got "
                         f"{type(design).__name__}")
    missing = [k for k in KEYS if k not in design]
    if missing:
        raise ValueError(f"the design has no {missing[0]!r} ({KEYS[missing[0]]})")
    unknown = [k for k in design if k not in KEYS and k not in OPTIONAL]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; a design has {', '.join(KEYS)} "
                         f"(and optionally {', '.join(OPTIONAL)})")
    for key in ("nodes_per_run", "tp", "pp", "zero", "spare_nodes"):
        v = design[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key in ("zero", "spare_nodes") else 1):
            raise ValueError(f"{key} must be an integer ({KEYS[key]}), got {v!r}")
    if design["nodes_per_run"] + design["spare_nodes"] > scenario.nodes:
        raise ValueError(f"nodes_per_run + spare_nodes is more than the {scenario.nodes} nodes")
    if design["zero"] > 3:
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {design['zero']!r}")
    if design["recompute"] not in planner.RECOMPUTE:
        raise ValueError(f"recompute must be one of {planner.RECOMPUTE}, got {design['recompute']!r}")
    if design["checkpoint_tier"] not in TIERS:
        raise ValueError(f"checkpoint_tier must be one of {TIERS}, got {design['checkpoint_tier']!r}")
    if design["placement"] not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {design['placement']!r}")
    minutes = design["checkpoint_minutes"]
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes < math.inf:
        raise ValueError(f"checkpoint_minutes must be a positive number, got {minutes!r}")
    if minutes > HORIZON / 60:
        raise ValueError(f"checkpoint_minutes must be at most {HORIZON / 60:,.0f} (the "
                         f"{HORIZON / DAY:.0f} days the day's runs are simulated for), "
                         f"got {minutes!r}")
    mb = design.get("micro_batch")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb < 1):
        raise ValueError(f"micro_batch must be a positive integer or absent, got {mb!r}")


@dataclass
class Grade:
    """What :func:`evaluate` finds: points per rubric item, each with the lines that say
    what the choices cost, and the numbers behind them."""

    points: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    numbers: dict = field(default_factory=dict)

    @property
    def total(self):
        return sum(self.points.values())

    def table(self):
        """The score table, one block per rubric item."""
        lines = []
        for item, most in RUBRIC.items():
            lines.append(f"{item:<11} {self.points[item]:>3} / {most}")
            lines += [f"    {note}" for note in self.notes[item]]
        lines.append(f"{'total':<11} {self.total:>3} / 100")
        return "\n".join(lines)


def _h(seconds):
    return f"{seconds / 3600:.1f} h"


def evaluate(design, scenario=QUESTION):
    """Grade ``design`` (see :data:`KEYS`) on ``scenario``: a :class:`Grade`.

    * topology (40): 25 for the layout's MFU against the best layout on the same GPUs
      (0 if it does not keep :data:`MEMORY_HEADROOM` free), 15 for a placement rule that
      keeps a run inside one 32-node scalable unit when one has room
      (:func:`keeps_units`; a run placed across units also runs slower in the day below,
      :func:`crossing_slowdown`);
    * checkpoint (30): the expected goodput (Daly) of the tier and interval, against the
      best tier at its Daly interval: 2 points of goodput below it are worth nothing;
    * scheduling (30): the share of the runs the scheduler finishes within the day, with
      the failures drawn for the day.
    """
    validate(design, scenario)
    s, g = scenario, Grade()
    nodes = design["nodes_per_run"]
    # --- topology
    notes = g.notes["topology"] = []
    try:
        est = layout_of(design, s)
    except ValueError as error:
        est, why = None, str(error)
    best = best_layout(nodes, s)
    if best is None:
        raise ValueError(f"no layout of the model fits {nodes} nodes: give each run more")
    layout_points = 0
    if est is None:
        notes.append(f"layout refused by the planner: {why}")
    elif not fits(est):
        notes.append(f"layout does not fit: {est.memory_per_gpu / 2**30:.1f} GiB per GPU, "
                     f"more than {1 - MEMORY_HEADROOM:.0%} of {est.device_memory / 2**30:.0f} "
                     "GiB (the CUDA context, NCCL's buffers and fragmentation need the rest)")
    else:
        # every 1 % of MFU below the best costs 2 % of the points: 10 % slower keeps 80 %
        below = 1 - min(1.0, est.mfu / best.mfu)
        layout_points = round(LAYOUT_POINTS * max(0.0, 1 - 2 * below))
        notes.append(f"layout tp={est.tp} pp={est.pp} dp={est.dp} zero={est.zero}: "
                     f"MFU {est.mfu:.1%}, {est.memory_per_gpu / 2**30:.0f} GiB/GPU; best "
                     f"{best.mfu:.1%} (tp={best.tp} pp={best.pp} dp={best.dp} zero={best.zero})")
        if est.tp > s.gpus_per_node:
            notes.append(f"tensor parallelism over {est.tp} GPUs crosses nodes: its "
                         "all-reduces run on InfiniBand, every layer")
    run = est if est is not None and fits(est) else best   # else schedule the best one
    if run is best and est is not best:
        notes.append("the day below is scheduled with the best layout instead")
    compute = s.tokens_per_run / tokens_per_second(run)
    g.numbers.update(layout=est, best=best, compute_seconds=compute)
    # --- checkpoint
    notes = g.notes["checkpoint"] = []
    rates = failure_rates(nodes, s)
    tiers = checkpoint_tiers(nodes, s)
    mtbf = rates["job_mtbf"]
    tier = tiers[design["checkpoint_tier"]]
    tau = design["checkpoint_minutes"] * 60.0
    mine = goodput.expected_goodput(tau, tier["delta"], mtbf, tier["restore"])
    top = max(goodput.expected_goodput(goodput.daly_interval(t["delta"], mtbf), t["delta"],
                                       mtbf, t["restore"]) for t in tiers.values())
    daly = goodput.daly_interval(tier["delta"], mtbf)
    # a point of goodput is 1 % of the cluster's day (80 GPUs): 2 points below the best
    # tier at its best interval are worth nothing
    g.points["checkpoint"] = round(30 * max(0.0, 1 - (top - mine) / 0.02))
    notes.append(f"job MTBF {mtbf / 3600:.0f} h ({nodes} nodes x "
                 f"{s.failures_per_node_per_day:.1%}/day); {design['checkpoint_tier']}: "
                 f"write {tier['delta']:.1f} s, restart {tier['restore']:.0f} s")
    notes.append(f"every {design['checkpoint_minutes']:g} min: expected goodput {mine:.1%}; "
                 f"Daly's interval for this tier {daly / 60:.1f} min; best tier "
                 f"{top:.1%}")
    if tau > mtbf:
        notes.append("the interval is longer than the job's MTBF: most segments never finish")
    g.numbers.update(mtbf=mtbf, goodput=mine, best_goodput=top, tiers=tiers, rates=rates)
    # --- scheduling
    notes = g.notes["scheduling"] = []
    slowdown = crossing_slowdown(run, s)
    result = run_day(design, s, compute, tier["delta"], tier["restore"], slowdown)
    done = [j for j in result.jobs if j.finished and j.end <= DAY]
    # the requirement is all the runs in a day: missing one costs half the points
    g.points["scheduling"] = (RUBRIC["scheduling"] if len(done) == s.runs
                              else round(RUBRIC["scheduling"] / 2 * len(done) / s.runs))
    active = s.nodes - design["spare_nodes"]
    at_once = active // nodes
    notes.append(f"{s.runs} runs of {nodes} nodes, {_h(compute)} of training each; "
                 f"{at_once} fit at once on {active} nodes ({design['spare_nodes']} spares)")
    in_day = sum(a["outcome"] == "failed" and a["end"] <= DAY
                 for j in result.jobs for a in j.attempts)
    last = (f"the last after {_h(result.makespan)}" if not result.unfinished
            else f"{len(result.unfinished)} unfinished after 3 days")
    notes.append(f"node failures stopped {in_day} runs during the day; {len(done)} of "
                 f"{s.runs} runs finished within 24 h, {last}")
    if len(done) < s.runs:
        notes.append("the requirement (every run within the day) is not met")
    # --- placement, part of the topology score
    placements = [a["placement"] for j in result.jobs for a in j.attempts]
    inside = sum(len({n // NODES_PER_SWITCH_GROUP for n, _ in p}) == 1 for p in placements)
    share = inside / len(placements) if placements else 0.0
    aware, why = keeps_units(design["placement"], s)
    g.points["topology"] = layout_points + (RUBRIC["topology"] - LAYOUT_POINTS if aware else 0)
    notes = g.notes["topology"]
    notes.append(f"placement {design['placement']}: {inside} of {len(placements)} job "
                 f"placements inside one {NODES_PER_SWITCH_GROUP}-node unit (rails one hop "
                 f"apart); across units a step takes {slowdown:.3f}x as long")
    if not aware:
        notes.append(f"placement {design['placement']} is not topology-aware: {why}")
    g.numbers.update(schedule=result, finished_in_day=len(done), placement_share=share,
                     stopped_in_day=in_day, topology_aware=aware, crossing_slowdown=slowdown)
    return g


def check_design(design, scenario=QUESTION):
    """Grade ``design`` and print the score table (the lesson's grader; the lab's check
    is ``checks.check_design``). Returns the :class:`Grade`."""
    grade = evaluate(design, scenario)
    print(grade.table())
    return grade


def with_scenario(**changes):
    """:data:`QUESTION` with ``changes`` (another failure rate, more runs, ...)."""
    return replace(QUESTION, **changes)
