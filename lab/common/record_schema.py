"""The record's schema: every field a results.jsonl record may have, with its kind and
meaning (lab.common.results writes and reads the records; docs/pages/running.md carries
schema_markdown(), a test keeps the two the same)."""
from __future__ import annotations

SCHEMA_VERSION = 1

# Every field of a record: name -> (kind, meaning). Dotted names are nested.
SCHEMA = {
    "schema_version": ("int", f"version of this schema (now {SCHEMA_VERSION})"),
    "run_id": ("str", "the results directory's name: one `invoke bench` invocation"),
    "record_id": ("str", "unique id of this record"),
    "status": ("str", "`ok`; `failed` (then `error` is set and figures may be absent); or "
               "`skipped`, a sweep's combination that cannot run here (`error.reason` says why)"),
    "started_at": ("str", "UTC start time, ISO 8601"),
    "finished_at": ("str", "UTC end time, ISO 8601"),
    "config": ("object", "the run's configuration: model, framework, backend, device, data, "
               "epochs, batch_size (per rank), test_batch_size, lr (before scaling), momentum, "
               "compression, seed, warmup_steps, max_steps, synthetic_size, threads, link (the "
               "simulated cluster's link shaping, RATE[/DELAY], empty when none), repeat (which "
               "repeat of its combination, from 0: bench --repeat), strategy (how the work is spread: "
               "ddp, zero1, fsdp, pipeline, model-parallel, deepspeed, rpc-pipeline, dataparallel), "
               "micro_batches and schedule (pipelines), zero_stage (deepspeed), devices "
               "(dataparallel's GPUs), precision (fp32, tf32, bf16 or fp16; absent in records "
               "made before it existed: fp32), compile (bench --compile: the model ran through "
               "torch.compile; absent in records made before it existed: false)"),
    "world.np": ("int", "number of processes (ranks); on every record, whatever its status"),
    "world.nodes": ("int", "number of distinct hosts the ranks ran on (failed and skipped "
                    "records: the hosts asked for); on every record"),
    "world.hosts": ("list[str]", "host name of each rank, by rank"),
    "world.devices_per_node": ("int", "ranks (devices) per host"),
    "world.cores": ("int, optional", "added by bench: the cores of the machine where the ranks ran "
                    "most crowded (their affinity; on the compose cluster, the most crowded node's "
                    "own share during a run across nodes, else this machine's)"),
    "world.node_cores": ("object, optional", "added by bench on the compose cluster across nodes: "
                         "node -> the cpuset it had to itself during the run (\"0-1\"); absent "
                         "where the nodes shared the machine's cores"),
    "world.oversubscribed": ("bool, optional", "added by bench: the ranks times --threads exceeded "
                             "those cores, so the run's times measure the scheduler too; the report "
                             "never reads such a row as scaling"),
    "world.place": ("str, optional", "added by bench: where the ranks ran, as bench's runner "
                    "names it (local, image, cluster, hosts, ...); the report never puts runs of "
                    "different places in one row"),
    "world.launcher_ended": ("str, optional", "added by bench: the launcher had not exited within "
                             "the stall bound after every rank ended, and the stall watch ended it"),
    "world.scheduler": ("object, optional", "a job run by a scheduler: name (slurm), job_id, nodelist "
                        "(from the ranks' SLURM_* variables), and, added by bench once the job "
                        "ended, state (Slurm's final JobState) and exit_code (exit:signal)"),
    "world.controller": ("str", "what carried the collectives: gloo, mpi, nccl or ccl (Horovod: its "
                         "controller, or nccl and ccl, its GPU and oneCCL operations; DDP: the "
                         "process group's back end; none: local)"),
    "world.allreduce_ops": ("object, optional", "--backend ccl: ops (the all-reduce operations "
                            "Horovod's own timeline named for a few one-value all-reduces at the "
                            "start, CCL_ALLREDUCE when oneCCL carried them) and check_s (what that "
                            "check took; lab.common.ccl.allreduce_ops)"),
    "world.horovod": ("object, optional", "Horovod runs: fusion_threshold_bytes and cycle_time_ms "
                      "as rank 0's Horovod used them (Horovod 0.28.1's defaults, 128 MiB and 1 ms, "
                      "or HOROVOD_FUSION_THRESHOLD in bytes and HOROVOD_CYCLE_TIME in ms), set_by "
                      "(the variables that set them) and autotune (HOROVOD_AUTOTUNE: the values "
                      "not set are then tuned from this starting point)"),
    "figures.throughput_img_s": ("float", "global images per second over the timed steps, "
                                 "bounded by the slowest rank"),
    "figures.collective_alone": ("object, optional", "the ddp strategy at 2 or more ranks: the step's collective timed alone before training on the run's own payload (lab.worker.collective): op, size_bytes (nccl-tests' size), time_s (the slowest rank's median), timed, algbw_gbs, busbw_gbs (nccl-tests' formulas), ranks, cost_s; or op and error"),
    "figures.step_parts": ("object, optional", "each step split into its parts on every rank (lab.worker.step_parts): note (what this strategy cannot separate, or null), sum_tolerance, and ranks, one per rank: parts_s (data, other, forward, backward, communication: exposed beyond the backward's compute, waiting: for the slowest rank, optimizer; each the mean over the rank's typical steps, the middle half by duration), steps, sum_s (the parts but data), step_s (those steps as the training loop timed them), step_p50_s (the median of all its timed steps), sum_within_tolerance (sum_s within sum_tolerance of step_s); ranks is empty where the strategy's step is not split"),
    "figures.gradient_values": ("int, optional", "the ddp strategy: number of gradient values synchronised per step (the model's parameters)"),
    "figures.gradient_tensors": ("list of int, optional", "the ddp strategy: each parameter's number of values, in the model's order (the cost model's buckets)"),
    "figures.payload_bytes_per_step": ("int, optional", "the ddp strategy: gradient bytes one rank hands to the collective per step: 4 per value "
                                       "uncompressed, 2 with fp16, 1 plus a float32 scale per 512 values with int8"),
    "figures.wire_bytes_per_step_estimate": ("int, optional", "the ddp strategy: estimate of the bytes one rank sends per step: ring all-reduce "
                                             "2(n-1)/n of the payload, ring all-gather (8-bit codecs) n-1 times it"),
    "figures.codec_zeroed_fraction": ("float, optional", "8-bit codecs only: share of rank 0's nonzero gradient values "
                                      "that the codec sent as 0, over all steps"),
    "figures.collective": ("str, optional", "the ddp strategy: allreduce, or allgather for the 8-bit codecs (int8 sums would overflow)"),
    "figures.compile_s": ("float, optional", "bench --compile: the seconds the compiler spent (TorchDynamo's own "
                          "count, frames and their backward graphs: lab.worker.compiled) on the slowest "
                          "rank; the steps in which it ran are never timed"),
    "figures.compile_s_per_rank": ("list[float], optional", "bench --compile: the compiler's seconds on each rank"),
    "figures.compile_steps": ("list[object], optional", "bench --compile: rank 0's steps in which the compiler "
                              "ran: step (from 0) and step_s (its wall time, compiling included), kept out "
                              "of the step-time figures"),
    "figures.step_time_mean_s": ("float", "mean time of a timed training step (rank 0)"),
    "figures.step_time_p50_s": ("float", "median step time (rank 0)"),
    "figures.step_time_p95_s": ("float", "95th-percentile step time (rank 0)"),
    "figures.timed_steps": ("int", "steps timed per rank (warm-up steps, and with --compile the steps "
                            "that compiled, excluded)"),
    "figures.test_accuracy": ("float", "test accuracy (0..1) after the last epoch, over all ranks"),
    "figures.final_loss": ("float", "mean training loss of the last epoch over all ranks"),
    "figures.step_losses": ("object or null, optional", "first, last: the training loss of the launch's first and "
                            "last 3 steps (fewer in a shorter run), each averaged over the ranks that "
                            "compute one (a pipeline's last stage); null where none did"),
    "figures.peak_memory_bytes": ("list[int]", "peak memory per rank: CUDA memory allocated "
                                  "on a GPU, maximum resident set size on the CPU"),
    "figures.peak_reserved_bytes": ("list[int or null]", "per rank, on a GPU: the most CUDA memory "
                                    "torch's caching allocator held (torch.cuda.max_memory_reserved: "
                                    "allocated plus cached blocks); null on the CPU"),
    "figures.reserved_bytes": ("list[int or null]", "per rank, on a GPU: what the allocator held "
                               "at the end (torch.cuda.memory_reserved); null on the CPU"),
    "figures.held_bytes": ("list[object]", "per rank: the bytes it keeps in parameters, gradients "
                           "and optimizer_state, and their total, summed over distinct tensor "
                           "storages (a sharded tensor counts its local shard) between two steps"),
    "figures.parameter_digests": ("list[str or null]", "per rank: a digest of its parameters after "
                                  "training; equal digests, equal replicas (null where a rank holds "
                                  "one pipeline stage)"),
    "figures.batch_semantics": ("str", "what --batch-size meant for this strategy: per process, or "
                                "in all (and in how many micro-batches)"),
    "figures.stage_layers": ("list[list[int]], optional", "pipeline strategies: each stage's "
                             "[first, last) layer of the model's layer list"),
    "figures.micro_batches": ("int, optional", "pipeline strategies: micro-batches per step"),
    "figures.zero_stage": ("int, optional", "deepspeed: the ZeRO stage"),
    "figures.ceiling": ("object, optional", "bench --ceiling: the compute ceiling measured around this "
                        "run: images_per_s (the mean of before and after; each from the median step, timed for at "
                        "least the model's minimum of steps and at least lab.worker.ceiling.MIN_SECONDS), "
                        "before, after, spread (before and after: each process's (p90 - p10) / median "
                        "step), processes, "
                        "hosts (where it was measured: every node or server of the run), input "
                        "([channels, height, width] the run trains on), classes and precision (the "
                        "run's --precision, at which it was measured)"),
    "figures.optimizer_state_split": ("list[object], optional", "deepspeed, per rank: the optimizer "
                                      "state split into ZeRO's fp32 master partition "
                                      "(master_weights) and the wrapped optimizer's own state"),
    "figures.checkpoints": ("object, optional", "--checkpoint-every: the checkpoints the run's (last) "
                            "launch wrote: written, total_s (their seconds, every rank waiting), share "
                            "(of that launch's training loop)"),
    "figures.lr_used": ("float", "learning rate after scaling by the world size"),
    "figures.forward_dtype": ("str or null", "the dtype rank 0's model computed in, in its first "
                              "step: the most common among its layers' outputs (the modules with "
                              "weights), not the model's output, which autocast may return in "
                              "float32 (bfloat16 or float16 under --precision bf16 or fp16, "
                              "float32 otherwise; null for the pipeline strategies, whose "
                              "schedule runs the forward)"),
    "figures.startup_s": ("float or null", "seconds from bench starting the launcher to the first "
                          "timed step, for the slowest rank; null when the job was not started "
                          "by bench"),
    "figures.startup_phases_s": ("object", "that rank's start-up by phase, seconds: launcher (until "
                                 "its Python ran the worker), imports (torch), rendezvous (the "
                                 "framework and its process group), data (the data set loaded), "
                                 "setup (model, optimizer, first broadcast), warmup (the warm-up "
                                 "steps)"),
    "figures.startup_host_s": ("object, optional", "bench's share of the start-up before the launch, "
                               "seconds (lab.host.run.startup): interpreter (the command's Python, "
                               "invoke), plan, runner (choosing where the ranks run), probe (the "
                               "stack), checks, prepare; in a sweep from the previous launch's "
                               "end, the phases not repeated 0"),
    "figures.startup_total_s": ("float, optional", "startup_host_s's sum plus startup_s: from the "
                                "command (in a sweep: the previous launch's end) to the first "
                                "timed step"),
    "epochs": ("list[object]", "per epoch: epoch, train_loss, test_accuracy, epoch_time_s, "
               "shard_sizes (samples each rank trained on; the shards are disjoint by "
               "construction)"),
    "restarts": ("list[object], optional", "bench --max-restarts: one entry per relaunch of the job, "
                 "in order: attempt (the failed launch's name), started_at, error (how that launch "
                 "failed, as bench named it: rank, host, exit_code, signal, reason), "
                 "resumed_from_step (where the relaunch resumed: a checkpoint's step, or 0), "
                 "checkpoint (its file, null without one), redone_s (the failed launch's work "
                 "since that checkpoint, lost), relaunch_s (from the failure to the resumed "
                 "launch's first step) and lost_s (their sum: the time the fault cost); the "
                 "figures are the last launch's, after its own warm-up"),
    "step_times_s": ("list[float]", "every timed step's time on rank 0, in order"),
    "manifest": ("object", "the environment: hosts, cpu_model, gpus (NVML), driver, cuda, "
                 "cudnn, nccl, mpi, nics (name, driver, speed), gpu_topology (NVLink/PCIe summary), "
                 "torch, torchvision, horovod, python, os, image (id and "
                 "labels, or null outside the image), kit_path (which copy of lab ran)"),
    "error.rank": ("int or null", "on failure: the rank that failed first, when known"),
    "error.host": ("str or null", "on failure: that rank's host"),
    "error.exit_code": ("int or null, optional", "on failure, when the launcher said: that rank's "
                        "exit status"),
    "error.signal": ("int or null, optional", "on failure, when the launcher said: the signal that "
                     "ended that rank (9: SIGKILL, as the out-of-memory killer sends)"),
    "error.reason": ("str", "on failure: one line saying what went wrong"),
    "error.slurm": ("object, optional", "a Slurm job that failed: job_id, state (JobState: FAILED, "
                    "CANCELLED, TIMEOUT, NODE_FAIL, ...), reason, exit_code, nodes, failed_nodes, states (as "
                    "polled: seconds after submission, JobState/Reason), "
                    "script (the batch script, relative to the run's folder); no job_id when "
                    "sbatch refused it"),
    "error.stalled": ("object, optional", "a run bench's stall watch stopped (`error.reason` "
                      "starts with `stalled:`): bound_s (the silence that ended it), behind (the "
                      "culprits), rule (what singled them out: not answering, not in a collective, "
                      "or behind by progress), waiting (the ranks waiting for them), ranks (per "
                      "rank: rank, host, behind, answering, phase, step, where in the step, stack: "
                      "its main thread's frames, most recent first), rendezvous "
                      "(a stall before the group formed: world, started, address, port, "
                      "interface, explanation), horovod (Horovod's stall check: after_s, "
                      "missing: rank -> tensors) and flight_recorder (GPU runs of DDP over NCCL: "
                      "the ranks' Flight Recorder dumps, relative to the run's folder)"),
    "error.log_tail": ("str", "on failure: the end of the job's output"),
}


def _lookup(record: dict, dotted: str):
    node = record
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def missing_fields(record: dict) -> list[str]:
    """Schema fields a record lacks. A failed record needs only the error fields and
    what identifies the run; an ok record needs everything but the error."""
    out = []
    for name in SCHEMA:
        if SCHEMA[name][0].endswith(", optional"):
            continue
        if record.get("status") == "ok" and name.startswith("error."):
            continue
        if record.get("status") in ("failed", "skipped") and (name.split(".")[0] in (
                "figures", "epochs", "step_times_s", "manifest") or name.startswith("world.")
                and name not in ("world.np", "world.nodes")):
            continue
        try:
            _lookup(record, name)
        except KeyError:
            out.append(name)
    return out


def schema_markdown() -> str:
    lines = [f"Schema version {SCHEMA_VERSION}.", "", "| field | type | meaning |",
             "| --- | --- | --- |"]
    lines += [f"| `{k}` | {t} | {m} |" for k, (t, m) in SCHEMA.items()]
    return "\n".join(lines) + "\n"
