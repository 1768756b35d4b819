"""The cost model's assumptions (lab.report.cost_model), one sentence each: predict() names
the keys a prediction relied on, the report prints their texts beside its table and
prediction.json holds them all."""

ASSUMPTIONS = {
    "ready": "Gradients become ready uniformly over the backward pass (bytes in proportion "
             "to the backward's time), as the records hold no per-bucket ready times.",
    "algorithm": "Gloo's all-reduce is a ring, 2(n-1) latency steps and 2(n-1)/n of the payload "
                 "per rank; Open MPI's is the algorithm its coll/tuned component picks by size "
                 "and ranks (at 2 ranks each moves the payload once in 1 or 2 steps); "
                 "all-gather: n-1 steps and (n-1)/n of its output.",
    "serial": "Collectives run one at a time, in order, and a bucket's collective does not "
              "slow the backward it overlaps.",
    "slowdown": "Where no compute ceiling was measured at 1 and N workers, ranks sharing cores "
                "or a GPU are assumed not to slow each other (the what-if table, every worker on a "
                "server of its own).",
    "slowdown_parts": "The explained figure's slowdown is the N-worker run's own compute (forward, "
                      "backward, optimizer and the rest, from its step parts) over the 1-worker "
                      "run's, and its waiting the run's own: measured in the run, so it explains the "
                      "step rather than foretells it, and is shown apart from the prediction.",
    "slowdown_ceiling": "The slowdown is N x the compute ceiling of one process over that of N "
                        "processes at once placed as the ranks are (--ceiling: the model's steps "
                        "without a framework), measured apart from the run's steps, by this run or "
                        "another of the same model, batch, threads, precision and place.",
    "contention": "The compute slows beyond the ceiling's slowdown (the framework's threads and "
                  "waits beside the ranks' compute) by the median ratio of the step parts' slowdown "
                  "to the ceiling's that the other configurations of the same framework and back end "
                  "and model measured at the same workers, on any servers, place and link; where "
                  "none did, the other frameworks' (or back ends') on the model times this one's "
                  "ratio to theirs on the configurations of other models that both ran (framework "
                  "and model taken to multiply); else of the same framework and back end, else of any.",
    "contention_none": "No other configuration at these workers measured both its step parts and "
                       "its ceiling: the compute slows by the ceiling's slowdown alone.",
    "cycle": "Horovod's cycle cost (what each cycle of its background thread costs in a step "
             "beyond the collectives timed alone) is fitted to the exposed communication measured "
             "in the other configurations of the same back end: of the same model at this place on "
             "these servers and link, else on another link, else on other servers, else at another "
             "place; else of other models at this place (these servers and link, then these "
             "servers, then any), and carried unchanged to this one and to the configurations not run.",
    "cycle_self": "Horovod's cycle cost is fitted to this configuration's own measured exposed "
                  "communication (no other configuration of its back end at its place, nor of its "
                  "model elsewhere, measured "
                  "one): its exposed communication is then measured, not predicted.",
    "cycle_none": "No configuration of this Horovod back end at this place, nor of its model "
                  "elsewhere, measured its exposed "
                  "communication: its cycles are taken to cost nothing beyond their collectives.",
    "bucket": "DDP's bucket cost (what each bucket's collective exposes in the step beyond its "
              "fitted cost) is fitted to the exposed communication measured in the other "
              "configurations of the same back end and model (its place, servers and link, else "
              "another link, else other servers, else another place; never another model's, never "
              "its own), and "
              "carried unchanged to this one and to the configurations not run.",
    "bucket_none": "No other DDP configuration of this back end and model measured its "
                   "exposed communication: a bucket's collective is taken to cost its fitted cost.",
    "waiting": "Waiting for the slowest rank is the median of the ranks' mean waits that the "
               "other configurations measured at the same workers: of the same framework and back "
               "end, model, place and servers, else of the same framework, back end and model "
               "anywhere, else the other frameworks' (or back ends') at the same model, place and "
               "servers times this one's ratio to theirs on the configurations of other models that "
               "both ran, else of the same model, place and servers; 0 where none did, and for a "
               "configuration not run the one at the most workers, carried unchanged.",
    "backward": "Without measured step parts the backward is two thirds of the 1-worker "
                "step (twice the forward).",
    "link": "On another link the per-byte cost is the host's (the fitted cost less the "
            "fitted place's link) plus the link's, a payload byte taking 1.068 bytes of the link "
            "(TCP over Ethernet at MTU 1500, with one ACK per two segments of the other way), and "
            "its delay adds to every latency step; in the what-if table every worker has a "
            "server of its own.",
    "codec": "Compression's encode and decode cost nothing beyond the 1-worker step's "
             "(not measured apart).",
    "burst": "A link the simulated cluster shaped (tc's token bucket) sends the first bytes of "
             "each step's exchange, up to its bucket (about 4 ms of traffic), at the host's "
             "speed: the bucket (4 ms at the link's rate to fill) is taken as full when the step's "
             "exchange starts, its refill during the exchange as nothing, and each rank as "
             "having one of its own (true with one rank a server).",
    "cycle_wait": "Each Horovod collective timed alone (the run's own, doctor's Horovod sweep) "
                  "took at least one cycle of Horovod's background thread: from two cycles on its time "
                  "is taken as the collective's, below two cycles twice what it took beyond one (at "
                  "least 5% of it; where the work fits in a cycle it cannot be seen).",
    "fit": "With one size timed the latency is taken as 0 and the whole time as bandwidth.",
    "cores": "Ranks on one server share its cores in equal turns: each computes max(1, ranks x threads / "
             "cores) times slower than the 1-worker run did (oversubscription included), the cores being "
             "the 1-worker run's server's unless the target names them; memory bandwidth and caches are "
             "taken as not shared (a ceiling measured at N processes checks this).",
    "straggler": "Each rank's step is drawn from the 1-worker run's steps, independently: the ranks' mean "
                 "wait for the slowest is the expected maximum of N draws less their mean, times the "
                 "ranks' slowdown.",
    "agreement": "Each Horovod cycle with work costs, beyond its collectives, its agreement on the ready "
                 "tensors: one small all-reduce at the fitted cost (Horovod 0.28.1 controller.cc).",
    "sweeps": "The collective's latency and bandwidth come from doctor's sweeps of the back end alone "
              "(2 ranks, small and large messages; two regimes where least squares would drop the "
              "latency), never from a run of the configuration predicted.",
}
