"""Configuration checks, the worker's arguments, the results file and its schema."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.common import results
from lab.common.config import ConfigError, RunConfig, parse_args

# The documentation page that shows the schema (docs/pages/running.md, "The record").
RECORD_PAGE = Path(__file__).resolve().parent.parent / "docs" / "pages" / "running.md"


def test_worker_arguments_round_trip():
    cfg = RunConfig(model="resnet50", framework="horovod", backend="mpi", epochs=3, lr=0.05,
                    run_id="r1", results_dir="/tmp/x", fault="1:2")
    assert parse_args(cfg.to_args()) == cfg


@pytest.mark.parametrize("changes,message", [
    ({"backend": "tcp"}, "unknown backend 'tcp': choose one of gloo, mpi, nccl"),
    ({"model": "vgg"}, "unknown model"),
    ({"epochs": 0}, "--epochs must be at least 1"),
    ({"backend": "nccl"}, "nccl back end runs on GPUs only"),
    ({"framework": "none", "compression": "fp16"}, "needs a distributed framework"),
    ({"fault": "x"}, "RANK:STEP"),
    ({"max_steps": -1}, "cannot be negative"),
])
def test_bad_configurations_get_one_sentence(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        RunConfig(**changes).check()


def test_append_and_read_records(tmp_path):
    path = tmp_path / "r" / results.RESULTS_FILE
    results.append_record(path, {"run_id": "a", "status": "ok"})
    results.append_record(path, {"run_id": "a", "status": "failed"})
    recs, problems = results.read_records(path)
    assert [r["status"] for r in recs] == ["ok", "failed"] and not problems
    assert all(r["schema_version"] == results.SCHEMA_VERSION for r in recs)


def test_a_torn_line_loses_nothing_else(tmp_path):
    path = tmp_path / results.RESULTS_FILE
    results.append_record(path, {"run_id": "a", "status": "ok"})
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "b", "sta')  # a crash mid-write
    results.append_record(path, {"run_id": "c", "status": "ok"})
    recs, problems = results.read_records(path)
    assert [r["run_id"] for r in recs] == ["a", "c"]
    assert len(problems) == 1 and ":2:" in problems[0]


def test_newer_schema_is_reported_not_misread(tmp_path):
    path = tmp_path / results.RESULTS_FILE
    path.write_text(json.dumps({"schema_version": results.SCHEMA_VERSION + 1}) + "\n")
    recs, problems = results.read_records(path)
    assert not recs and "upgrade the kit" in problems[0]


def test_missing_fields():
    assert "figures.throughput_img_s" in results.missing_fields({"status": "ok"})
    failed = results.make_record("failed", run_id="a", config={}, np=2, nodes=2, started_at="",
                                 error={"rank": 1, "host": "h", "reason": "r"})
    assert results.missing_fields(failed) == []
    assert failed["world"] == {"np": 2, "nodes": 2}
    del failed["world"]
    assert results.missing_fields(failed) == ["world.np", "world.nodes"]
    with pytest.raises(ValueError, match="says why"):
        results.make_record("skipped", run_id="a", config={}, np=1, nodes=1, started_at="",
                            error={})


def test_records_written_before_world_was_on_every_status_are_read_with_it(tmp_path):
    path = tmp_path / results.RESULTS_FILE
    results.append_record(path, {"run_id": "a", "record_id": "b", "status": "skipped",
                                 "started_at": "", "finished_at": "", "config": {}, "np": 2,
                                 "nodes": 2, "error": {"reason": "r"}})
    [r] = results.read_records(path)[0]
    assert r["world"] == {"np": 2, "nodes": 2} and "np" not in r


def test_readme_documents_the_current_schema():
    assert results.schema_markdown() in RECORD_PAGE.read_text(), \
        "docs/pages/running.md's schema table is stale: paste the output of python -m lab.common.results --schema"


APPENDER = """
import sys
from lab.common import results
for i in range(int(sys.argv[3])):
    results.append_record(sys.argv[1], {"status": "ok", "writer": sys.argv[2], "i": i, "pad": "x" * 2000})
"""


def test_appenders_and_a_rewrite_at_once_lose_no_record(tmp_path):
    """Two processes append to one results file while a third rewrites it again and again
    (update_records: a new file renamed over it): every record is there once."""
    path = tmp_path / "results.jsonl"
    results.append_record(path, {"status": "ok", "writer": "first", "i": 0})
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), w, "60"], cwd=Path(__file__).resolve().parent.parent)
               for w in ("a", "b")]
    rewrites = 0
    while any(w.poll() is None for w in writers):
        results.update_records(path, 0, lambda r: dict(r, seen=r.get("seen", 0) + 1))
        rewrites += 1
        time.sleep(0.02)        # the appenders get the lock between rewrites
    assert all(w.returncode == 0 for w in writers)
    recs, bad = results.read_records(path)
    assert not bad and rewrites > 1
    assert sorted((r["writer"], r["i"]) for r in recs) == sorted(
        [("first", 0)] + [(w, i) for w in ("a", "b") for i in range(60)])
