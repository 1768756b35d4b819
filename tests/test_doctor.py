"""envcheck and `invoke doctor`: parsers on real captured outputs, probes made to fail
on purpose (a missing binary, a non-zero exit, garbage output, a timeout, a crash)
with the report still complete, and the doctor's run on this machine (no GPU)."""
import fcntl
import gzip
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from envcheck import findings, horovod_build, host, nccl_tests, probes, report, stack
from envcheck.probes import FAIL, PASS, SKIP, WARN, Result
from lab.common import collectives, display
from tests.conftest import FakeImage, requires_horovod

FIX = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


def test_nccl_tests_two_ranks_busbw_equals_algbw():
    out = nccl_tests.parse_nccl_tests((FIX / "nccl-tests-all-reduce-2x-gh200.txt").read_text())
    assert len(out["rows"]) == 8 and out["avg_busbw_gbs"] == pytest.approx(14.9966)
    first, last = out["rows"][0], out["rows"][-1]
    assert first["size_bytes"] == 1048576 and first["time_us"] == pytest.approx(339.61)
    assert last["algbw_gbs"] == pytest.approx(22.86) and last["inplace_wrong"] == 0
    assert [r["host"] for r in out["ranks"]] == ["nid007106", "nid007109"]
    for r in out["rows"]:     # n=2: 2(n-1)/n = 1
        assert nccl_tests.allreduce_busbw(r["algbw_gbs"], 2) == pytest.approx(r["busbw_gbs"], abs=0.01)
        assert r["size_bytes"] / r["time_us"] / 1e3 == pytest.approx(r["algbw_gbs"], abs=0.01)


def test_nccl_tests_sixteen_ranks_busbw_formula():
    out = nccl_tests.parse_nccl_tests((FIX / "nccl-tests-all-reduce-16x-a100.txt").read_text())
    [row] = out["rows"]
    assert len(out["ranks"]) == 16 and len({r["host"] for r in out["ranks"]}) == 2
    assert nccl_tests.allreduce_busbw(row["algbw_gbs"], 16) == pytest.approx(row["busbw_gbs"], abs=0.01)
    assert nccl_tests.allreduce_busbw(5.0, 1) == 0.0       # one rank: nothing crosses a bus


def test_nccl_tests_rows_among_nccl_debug_lines_and_garbage():
    text = (FIX / "nccl-tests-all-reduce-2x-gh200.txt").read_text()
    noisy = text.replace("# Out of bounds", "host:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 - Destroy COMPLETE\n# Out of bounds")
    assert len(nccl_tests.parse_nccl_tests(noisy)["rows"]) == 8
    with pytest.raises(ValueError):
        nccl_tests.parse_nccl_tests("NCCL WARN something went wrong\n")


def test_nccl_tests_numbers_too_wide_for_their_columns():
    """nccl-tests (src/util.cu, v2.18+) prints a time of 10^7 us or more as "%7.1e" and
    #wrong as "%6g": the 2x GH200 capture's last row as it would print with such values."""
    text = (FIX / "nccl-tests-all-reduce-2x-gh200.txt").read_text()
    last = [ln for ln in text.splitlines() if nccl_tests.NCCL_TESTS_ROW.match(ln)][-1]
    f = last.split()
    wide = (f"{f[0]:>12}  {f[1]:>12}  {f[2]:>8}  {f[3]:>6}  {f[4]:>6}  {'1.2e+07':>7}  {f[6]:>6}  "
            f"{f[7]:>6}  {'1e+06':>6}  {'1.0e+07':>7}  {f[10]:>6}  {f[11]:>6}  {'1.04858e+06':>6}")
    rows = nccl_tests.parse_nccl_tests(text.replace(last, wide))["rows"]
    assert len(rows) == 8
    assert rows[-1]["time_us"] == 1.2e7 and rows[-1]["inplace_time_us"] == 1.0e7
    assert rows[-1]["wrong"] == 1_000_000 and rows[-1]["inplace_wrong"] == 1_048_580
    assert rows[-1]["busbw_gbs"] == float(f[7])


def test_nvidia_smi_table():
    out = probes.parse_nvidia_smi((FIX / "nvidia-smi-4x-a100.txt").read_text())
    assert out["driver"] == "555.42.02" and out["driver_cuda"] == "12.5" and out["count"] == 4
    assert {d["name"] for d in out["devices"]} == {"NVIDIA A100-SXM4-80GB"}
    assert out["devices"][3]["bus_id"] == "00000000:D4:00.0"
    assert out["devices"][0]["memory_bytes"] == 81920 * 2**20
    with pytest.raises(ValueError):
        probes.parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_ompi_info_cuda_flag():
    debian = gzip.open(FIX / "ompi_info-parsable-all-debian-4.1.4.txt.gz", "rt").read()
    assert probes.parse_ompi_info_cuda(debian) is False
    built = gzip.open(FIX / "ompi_info-parsable-all-4.1.4-cuda.txt.gz", "rt").read()
    assert probes.parse_ompi_info_cuda(built) is True       # the GPU image's, --with-cuda
    with pytest.raises(ValueError):
        probes.parse_ompi_info_cuda("ompi_info: command garbled")


def test_horovod_check_build():
    out = horovod_build.parse_check_build((FIX / "horovodrun-check-build-0.28.1.txt").read_text())
    assert out["version"] == "0.28.1" and out["frameworks"] == ["PyTorch"]
    assert out["controllers"] == ["MPI", "Gloo"] and "NCCL" not in out["tensor_operations"]


class _BuiltHorovod:
    """horovod.torch's build facts, as a GPU host's Horovod answered them."""
    def __init__(self, mpi, gloo, nccl, ddl=False, ccl=False):
        self._facts = {"mpi_built": mpi, "gloo_built": gloo, "nccl_built": nccl,
                       "ddl_built": ddl, "ccl_built": ccl}

    def __getattr__(self, name):
        return lambda: self._facts[name]


@pytest.mark.parametrize("fixture,built", [
    # the development machine's build (MPI and Gloo, no NCCL)
    ("horovodrun-check-build-0.28.1.txt", _BuiltHorovod(mpi=True, gloo=True, nccl=0)),
    # the GPU host's (Gloo and NCCL 2.28.9 without MPI: install-horovod.sh printed
    # "gloo=True mpi=False nccl=22809" under the same build)
    ("horovodrun-check-build-0.28.1-nccl.txt", _BuiltHorovod(mpi=False, gloo=True, nccl=22809)),
])
def test_horovods_build_facts_read_in_process_are_what_check_build_printed(fixture, built):
    printed = horovod_build.parse_check_build((FIX / fixture).read_text())
    assert horovod_build.check_build_facts(built, "0.28.1", ["PyTorch"]) == printed


@requires_horovod
def test_doctors_horovod_row_is_this_machines_horovodrun_check_build_without_running_it():
    from lab.common import kit
    printed = subprocess.run([kit.horovodrun(), "--check-build"], capture_output=True, text=True,
                             timeout=120, check=True).stdout
    r = stack.probe_horovod()
    assert r.status == PASS, r.fix
    facts = horovod_build.parse_check_build(printed)
    assert {key: r.value[key] for key in facts} == facts


def test_a_horovod_whose_torch_extension_is_missing_is_a_fail_that_says_rebuild(monkeypatch):
    """horovod/torch/__init__.py (0.28.1) survives a missing mpi_lib_v2: it prints a
    warning and defines none of mpi_built, gloo_built, ...; the row says so."""
    import importlib.machinery
    import types
    top = types.ModuleType("horovod")
    top.__spec__ = importlib.machinery.ModuleSpec("horovod", None)
    top.__version__ = "0.28.1"
    top.torch = types.ModuleType("horovod.torch")
    top.torch._MPI_LIB_AVAILABLE = False
    monkeypatch.setitem(sys.modules, "horovod", top)
    monkeypatch.setitem(sys.modules, "horovod.torch", top.torch)
    r = stack.probe_horovod()
    assert r.status == FAIL and "without its compiled extension (mpi_lib_v2)" in r.fix
    assert "install-horovod.sh" in r.fix


def test_horovods_frameworks_are_the_installed_ones_with_their_extension_built(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("torch", "mxnet") else real(name, *a)
                        if name != "tensorflow" else None)
    for framework, lib in (("torch", "mpi_lib_v2"), ("tensorflow", "mpi_lib")):
        (tmp_path / framework).mkdir()
        (tmp_path / framework / f"{lib}.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "mxnet").mkdir()          # installed, its extension not built
    assert horovod_build.horovod_frameworks(str(tmp_path)) == ["PyTorch"]


@pytest.mark.parametrize("driver,cuda,status", [
    ("580.95.05", "13.0", PASS), ("580.65.06", "13.0", PASS),
    ("575.57.08", "13.0", WARN),       # R575: CUDA forward compatibility, GPUs not known
    ("560.35.05", "13.0", FAIL),       # R560: not a forward-compatible branch of 13.0
    ("555.42.02", "12.6", WARN), ("560.35.05", "12.6", PASS), ("520.61.05", "12.6", FAIL),
    ("470.82.01", "12.6", WARN),       # R470: listed by nvidia/cuda 12.6 for forward compatibility
])
def test_driver_against_the_images_cuda(driver, cuda, status):
    assert probes.driver_supports(driver, cuda)[0] == status


def _r(name, status, value=None):
    return Result(name, status, value, "")


def test_findings_name_each_contradiction():
    host_r = {"gpus": _r("gpus", PASS, {"count": 2})}
    ranks = {"horovod": _r("horovod", PASS, {"gpu_operations": "MPI"}),
             "mpi_cuda_build": _r("mpi_cuda_build", PASS, False),
             "torch": _r("torch", PASS, {"cuda_build": "13.0", "cuda_available": True, "device_count": 1})}
    got = {f.name: f for f in findings.find(host_r, ranks, np=4, in_image=True)}
    assert got["finding: MPI GPU operations need a CUDA-aware MPI"].status == FAIL
    assert "--np 1" in got["finding: one GPU per rank with NCCL"].fix
    assert got["finding: the ranks see every GPU of the host"].status == FAIL   # 2 on host, 1 seen
    ranks["torch"] = _r("torch", PASS, {"cuda_build": "13.0", "cuda_available": False, "device_count": 0})
    got = {f.name: f for f in findings.find(host_r, ranks, np=1, in_image=True)}
    assert got["finding: a CUDA torch sees the GPUs"].status == FAIL and "--gpus" in got[
        "finding: a CUDA torch sees the GPUs"].fix
    got = {f.name: f for f in findings.find({"gpus": _r("gpus", SKIP)}, ranks, np=1, in_image=False)}
    assert got["finding: a CUDA torch sees the GPUs"].status == WARN   # no GPU anywhere: CPU runs


def test_small_shm_and_a_missing_nccl_interface(monkeypatch, tmp_path):
    class St:
        f_frsize, f_blocks = 4096, 16384          # 64 MiB: Docker's default
    monkeypatch.setattr(os, "statvfs", lambda p: St)
    r = host.probe_shm()
    assert r.status == WARN and "--shm-size" in r.fix
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib9")
    r = host.probe_nccl_socket_ifname()
    assert r.status == FAIL and "ib9" in r.fix


def test_a_probe_that_crashes_is_a_fail_with_the_reason(monkeypatch):
    def boom(path):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(os, "statvfs", boom)
    r = host.probe_shm()
    assert r.status == FAIL and "probe crashed: RuntimeError: disk on fire" in r.fix


def test_a_missing_binary_is_a_fail(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    r = stack.probe_mpi()
    assert r.status == FAIL and "mpirun not found" in r.fix


def _fake(path: Path, body: str):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def test_report_completes_when_probes_fail_on_purpose(tmp_path):
    """mpirun exits non-zero, ompi_info prints garbage, nvidia-smi hangs past the
    timeout (NVML made unimportable so the probe falls back to it): those checks FAIL
    with the reason, everything else is still measured, and the JSON is whole."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    _fake(fakes / "mpirun", 'echo "mpirun: simulated failure" >&2; exit 3')
    _fake(fakes / "ompi_info", 'echo "%%% not ompi_info output %%%"')
    _fake(fakes / "nvidia-smi", "sleep 30")
    nonvml = tmp_path / "nonvml"
    nonvml.mkdir()
    (nonvml / "pynvml.py").write_text("raise ImportError('made unimportable by the test')\n")
    env = dict(os.environ, PATH=f"{fakes}:{os.environ['PATH']}", ENVCHECK_TIMEOUT_NVIDIA_SMI="3",
               PYTHONPATH=f"{nonvml}:{REPO}")
    cp = subprocess.run([sys.executable, "-m", "envcheck", "--np", "2", "--json"], env=env,
                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert cp.returncode == 1, cp.stderr[-2000:]
    checks = {(c["where"], c["name"]): c for c in json.loads(cp.stdout)["checks"]}
    assert checks[("local", "mpi")]["status"] == FAIL
    assert "exited with 3: mpirun: simulated failure" in checks[("local", "mpi")]["fix"]
    assert checks[("local", "mpi_cuda_build")]["status"] == FAIL
    assert "no built_with_cuda_support" in checks[("local", "mpi_cuda_build")]["fix"]
    assert checks[("host", "gpus")]["status"] == FAIL
    assert "did not finish within 3 s" in checks[("host", "gpus")]["fix"]
    assert checks[("local", "mpi_hello")]["status"] == FAIL
    # ... and the rest was measured.
    assert checks[("local", "torch")]["status"] == PASS
    assert checks[("local", "collectives")]["status"] == PASS
    assert checks[("host", "os")]["status"] == PASS


def test_doctor_on_this_machine_without_a_gpu(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--local", "--np", "2", "--json"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    checks = {(c["where"], c["name"]): c for c in doc["checks"]}
    for name in ("gpus", "gpu_topology", "gpu_container_runtime", "driver_for_image_cuda"):
        assert checks[("host", name)]["status"] == SKIP and checks[("host", name)]["fix"], name
    for name in ("mpi_gpu_allreduce", "nccl_all_reduce_perf"):
        assert checks[("local", name)]["status"] == SKIP
    hello = checks[("local", "mpi_hello")]
    assert hello["status"] == PASS and hello["value"]["ranks"] == [0, 1]
    sweep = checks[("local", "collectives")]["value"]
    assert sweep["backend"] == "gloo" and sweep["ranks"] == 2
    assert list(sweep["ops"]) == list(collectives.OPS)
    for op, rows in sweep["ops"].items():
        assert len(rows) >= 5 and all(r["time_us"] > 0 for r in rows)
        # nccl-tests' bus factors at n=2: all-reduce 2(n-1)/n = 1, broadcast and reduce 1, the rest 1/2
        factor = 1.0 if op in ("allreduce", "broadcast", "reduce") else 0.5
        assert all(r["busbw_gbs"] == pytest.approx(factor * r["algbw_gbs"]) for r in rows), op
    assert sweep["reference"]["name"] == "memory copy" and sweep["reference"]["gbs"] > 0
    line = report.short("collectives", sweep)
    assert "share of the memory copy" in line and all(f"{op} " in line for op in collectives.OPS)
    over_mpi = checks[("local", "collectives_mpi")]["value"]     # Horovod's, under mpirun
    # Horovod has no reduce to a root: the others
    assert over_mpi["cycle_time_ms"] == 1.0      # each operation waits for Horovod's cycle: the fit takes it out
    assert over_mpi["backend"] == "mpi (Horovod)" and list(over_mpi["ops"]) == [
        op for op in collectives.OPS if op != "reduce"]
    assert all(r["busbw_gbs"] > 0 for rows in over_mpi["ops"].values() for r in rows)
    assert doc["counts"]["FAIL"] == 0 and doc["seconds"] > 0
    # on the terminal the checks skipped for want of a GPU are one line with the cause
    shown, [folded] = report.fold_skips(doc["checks"])
    gone = [c for c in doc["checks"] if not any(c is s for s in shown)]
    assert {"gpus", "gpu_container_runtime", "mpi_gpu_allreduce", "nccl_all_reduce_perf"} <= {
        c["name"] for c in gone}
    assert all(c["status"] == SKIP for c in gone) and len(gone) >= 8
    assert folded.startswith(f"skipped {len(gone)} checks that need a GPU (")
    assert checks[("host", "gpus")]["fix"] in folded and "--all" in folded
    assert not any(c["status"] == SKIP and "no GPU" in c["fix"] for c in shown)
    assert checks[("host", "rdma_devices")] in shown          # skipped for another cause
    # This machine's checks as the terminal table: 120 columns, every SKIP's fix in full.
    text = report.table(doc["checks"])
    assert max(len(line) for line in text.splitlines()) <= report.WIDTH
    rows, notes = table_cells(text)
    assert len(rows) == len(doc["checks"])
    for c, row in zip(doc["checks"], rows):
        fix = " ".join(c["fix"].split())
        assert row["fix"] == fix or f"{row['fix']} {c['name']} ({c['where']}), fix: {fix}" in notes, c["name"]


def table_cells(text):
    """The doctor's table read back by its columns (a row's wrapped lines joined), and its
    notes as one string."""
    lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"-+", lines[1])] + [None]
    names = lines[0].split()
    rows = []
    for line in lines[2:]:
        if not line.strip():
            break
        cells = [line[a:b].strip() if b else line[a:].strip() for a, b in zip(starts, starts[1:])]
        if cells[0]:
            rows.append({n: c for n, c in zip(names, cells)})
        else:
            for n, c in zip(names, cells):
                if c:
                    rows[-1][n] = f"{rows[-1][n]} {c}".strip()
    notes = " ".join(" ".join(lines[lines.index("") + 1:]).split()) if "" in lines else ""
    return rows, notes


LONG_FIX = ("no NVIDIA GPU found: NVML is not available (libnvidia-ml.so.1 not found) and nvidia-smi "
            "is not on the PATH; on a GPU machine install the NVIDIA driver and the container "
            "toolkit, then run invoke doctor again")


def _checks():
    """A doctor's results as the probes make them (Result.as_dict), with long values and fixes."""
    sweep = {"backend": "gloo", "ranks": 2, "reference": {"name": "memory copy", "gbs": 6.6}, "ops": {
        "allreduce": [{"size_bytes": 4096, "time_us": 118.0, "algbw_gbs": 0.035, "busbw_gbs": 0.035},
                      {"size_bytes": 16 * 2**20, "time_us": 9021.0, "algbw_gbs": 1.86, "busbw_gbs": 1.86}],
        "alltoall": [{"size_bytes": 4096, "time_us": 150.0, "algbw_gbs": 0.03, "busbw_gbs": 0.015},
                     {"size_bytes": 16 * 2**20, "time_us": 9021.0, "algbw_gbs": 0.8, "busbw_gbs": 0.4}]}}
    return [dict(Result("os", PASS, "Debian GNU/Linux 12 (bookworm), kernel 6.18.44-fc-v669").as_dict(), where="host"),
            dict(Result("gpus", SKIP, None, LONG_FIX).as_dict(), where="host"),
            dict(Result("collectives", PASS, sweep).as_dict(), where="local"),
            dict(Result("finding: MPI GPU operations need a CUDA-aware MPI", FAIL, None,
                        "rebuild Horovod with HOROVOD_GPU_OPERATIONS=NCCL").as_dict(), where="both"),
            dict(Result("shm", WARN, {"path": "/dev/shm", "bytes": 2**26}, "give containers --shm-size=1g").as_dict(),
                 where="host")]


def test_the_table_fits_120_columns_and_moves_long_fixes_to_notes():
    checks = _checks()
    text = report.table(checks)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120 == report.WIDTH
    gpus = next(line for line in lines if line.startswith("host") and " gpus " in line)
    mark = gpus.split()[-1]                                     # the fix went to a note
    assert re.fullmatch(r"\[\d\]", mark) and LONG_FIX[:20] not in gpus
    notes = " ".join(" ".join(lines[lines.index("") + 1:]).split())
    assert f"{mark} gpus (host), fix: {LONG_FIX}" in notes
    assert "give containers --shm-size=1g" in gpus.join(lines) and "0.06 GiB" in text   # short: in place
    # a long check name wraps within its column; nothing is lost
    assert "finding: MPI GPU operations" in text and "CUDA-aware MPI" in text
    # --wide: one row per check, everything on it
    wide = report.table(checks, width=None).splitlines()
    assert len(wide) == 2 + len(checks) and max(len(line) for line in wide) > 120
    assert any(LONG_FIX in line and line.startswith("host") for line in wide)
    # the line printed before the table (where the stack is checked) wraps the same way
    note = "the stack is checked as local processes: " + LONG_FIX
    assert max(map(len, report.line(note).splitlines())) <= 120 < len(note)
    assert " ".join(report.line(note).split()) == note and report.line(note, None) == note


def test_the_width_is_the_terminals_else_columns_else_120():
    class Tty(io.StringIO):
        def isatty(self):
            return True

        def fileno(self):
            raise OSError("no descriptor")     # a terminal whose size cannot be read
    assert display.width(io.StringIO(), {}) == 120 == display.DEFAULT
    assert display.width(io.StringIO(), {"COLUMNS": "80"}) == 80
    assert display.width(io.StringIO(), {"COLUMNS": "wide"}) == 120
    assert display.width(io.StringIO(), {"COLUMNS": "20"}) == display.NARROWEST
    assert display.width(Tty(), {"COLUMNS": "90"}) == 90
    # a real terminal's own width wins over $COLUMNS
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 97, 0, 0))
    with os.fdopen(child, "w") as tty:
        assert display.width(tty, {"COLUMNS": "80"}) == 97
    os.close(parent)


@pytest.mark.parametrize("columns", [120, 80])
def test_doctors_table_and_summary_fit_the_width(columns):
    """Every line doctor prints fits: the table narrowed by column, the summary (145
    columns with three slow checks) wrapped, nothing of it lost."""
    checks = _checks() + [dict(Result(f"collectives_across_{i}", PASS, None).as_dict(), where="both",
                               seconds=40.0 + i) for i in range(3)]
    text = report.table(checks, width=columns) + "\n" + report.summary(checks, 123.4, columns)
    assert max(map(len, text.splitlines())) <= columns
    one = report.summary(checks, 123.4)
    assert len(one) > 120 and "\n" not in one
    assert " ".join(report.summary(checks, 123.4, columns).split()) == one


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_a_narrow_terminal_narrows_the_check_column_and_never_fails(columns):
    """Where a row's place is long (an image's tag, the cluster) the check's name wraps
    in fewer columns; below what value and fix need, the table is wider than asked."""
    checks = [dict(c, where="image dl-lab-kit:gpu-nccl-cu130") for c in _checks()]
    lines = report.table(checks, width=columns).splitlines()
    fits = 31 + 2 + len("check") + 2 + len("status") + 2 + 2 * report.VALUE_MIN + 2
    assert max(map(len, lines)) <= max(columns, fits)
    assert sum(ln.startswith("image dl-lab-kit:gpu-nccl-cu130") for ln in lines) == len(checks)


def test_doctor_wide_and_help_name_the_flag():
    cp = subprocess.run([sys.executable, "-m", "invoke", "--help", "doctor"], cwd=REPO,
                        capture_output=True, text=True, timeout=60)
    assert "--wide" in cp.stdout and "120 columns" in cp.stdout


def test_python_m_envcheck_fits_120_columns_unless_wide():
    """The probes without Docker (python -m envcheck) print the same table: 120 columns by
    default, every value on its row with --wide."""
    def run(*flags):
        cp = subprocess.run([sys.executable, "-m", "envcheck", "--part", "host", *flags], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
        assert cp.returncode in (0, 1) and "Traceback" not in cp.stderr, cp.stderr
        return [ln for ln in cp.stdout.splitlines()[:-1]]
    narrow, wide = run(), run("--wide")
    assert max(map(len, narrow)) <= report.WIDTH
    assert "--wide" in subprocess.run([sys.executable, "-m", "envcheck", "--help"], cwd=REPO,
                                      capture_output=True, text=True).stdout
    assert not any(re.match(r"^\[\d+\] ", ln) for ln in wide)      # no notes: all on the rows
    assert any(re.match(r"^\[\d+\] ", ln) for ln in narrow) or max(map(len, wide)) <= report.WIDTH


def test_table_and_summary_render_every_check():
    checks = [dict(where="host", name="shm", status=WARN, value={"path": "/dev/shm", "bytes": 2**26},
                   fix="give containers --shm-size=1g"),
              dict(where="image", name="mpi", status=FAIL, value=None, fix="mpirun not found")]
    text = report.table(checks)
    assert "0.06 GiB" in text and "mpirun not found" in text
    assert report.summary(checks, 1.25) == ("doctor: 2 checks in 1.2 s: 0 PASS, 1 WARN, 1 FAIL, "
                                             "0 SKIP; problems found")


def test_each_probe_is_timed_and_the_summary_names_the_slowest(monkeypatch):
    import types
    clock = iter([100.0, 103.5, 200.0, 200.2])
    monkeypatch.setattr(probes, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))

    @probes.probe("slow")
    def slow():
        return "done"

    @probes.probe("quick")
    def quick():
        raise probes.ProbeError("it failed")
    checks = [slow().as_dict(), quick().as_dict(),
              dict(where="image", name="collectives", status=PASS, value=None, fix="", seconds=7.25),
              dict(where="image", name="mpi", status=PASS, value=None, fix="", seconds=1.0),
              dict(where="image", name="nccl", status=PASS, value=None, fix="", seconds=2.0)]
    assert [c["seconds"] for c in checks[:2]] == [3.5, 0.2] and checks[1]["status"] == FAIL
    assert report.summary(checks, 12.0).endswith(
        "problems found; slowest: collectives 7.2 s, slow 3.5 s, nccl 2.0 s")
    assert report.summary(checks[1:2], 0.2).endswith("problems found")


# A GPU host faked from captured output (tests/fixtures/README.md names each source):
# NVML made unimportable so the gpus probe reads `nvidia-smi`, a stand-in that prints
# the capture; torch in the stack made to see the same GPUs. No engine: the stack is
# checked as local processes; the probes that launch ranks over GPUs or load cuDNN
# (which needs the driver) cannot run here and are left out; they have their own tests.
def _fake_gpu_host(monkeypatch, tmp_path, capture, gpus_seen, docker=False):
    import torch

    from lab.common import docker_api
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    _fake(bin_ / "nvidia-smi", f"cat '{FIX / capture}'")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)          # import pynvml -> ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus_seen)
    for launch in ("probe_cudnn", "probe_mpi_hello", "probe_mpi_gpu_allreduce", "probe_nccl_tests",
                   "probe_collectives", "probe_collectives_mpi", "probe_collectives_ccl"):
        monkeypatch.setattr(stack, launch, lambda *a, _n=launch, **k: Result(_n, SKIP, None, "not run here"))
    if not docker:
        def no_engine(*a, **k):
            raise docker_api.DockerUnavailable("no Docker engine (the test's host has none)")
        monkeypatch.setattr(docker_api, "client", no_engine)


def _doctor_json(capsys, **flags):
    """`invoke doctor --json` with these flags: (exit code, checks by (where, name))."""
    from invoke import Context
    from invoke.exceptions import Exit

    import tasks
    code = 0
    try:
        tasks.doctor(Context(), json=True, **flags)
    except Exit as e:
        code = e.code
    doc = json.loads(capsys.readouterr().out)
    return code, {(c["where"], c["name"]): c for c in doc["checks"]}


def test_doctor_on_a_one_gpu_host_exits_0_with_its_default_flags(monkeypatch, tmp_path, capsys):
    _fake_gpu_host(monkeypatch, tmp_path, "nvidia-smi-1x-l4.txt", gpus_seen=1)
    code, checks = _doctor_json(capsys)
    assert checks[("host", "gpus")]["value"]["count"] == 1
    one = checks[("both", "finding: one GPU per rank with NCCL")]
    assert one["status"] == PASS and "--np 1 or fewer" in one["fix"]
    assert code == 0, [c for c in checks.values() if c["status"] == FAIL]


def test_doctor_on_an_eight_gpu_host(monkeypatch, tmp_path, capsys):
    """memlock at the usual 8 MiB (RLIMIT_MEMLOCK's default on Linux since 5.16): judged
    where the ranks run, here local processes over 8 GPUs, so a WARN there; on the host
    it is only shown (lab GPU containers get unlimited)."""
    import resource
    _fake_gpu_host(monkeypatch, tmp_path, "nvidia-smi-8x-h100.txt", gpus_seen=8)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (8 * 2**20, 8 * 2**20))
    code, checks = _doctor_json(capsys, np=8)
    assert checks[("host", "gpus")]["value"]["count"] == 8
    assert checks[("both", "finding: one GPU per rank with NCCL")]["status"] == PASS
    assert checks[("both", "finding: the ranks see every GPU of the host")]["status"] == PASS
    assert checks[("host", "memlock")]["status"] == PASS
    assert checks[("local", "memlock")]["status"] == WARN and "ulimit -l" in checks[("local", "memlock")]["fix"]
    assert code == 0


def _engine_with(engine_with, tags):
    """The CPU-less host's engine with these GPU images, each holding the CUDA 13.0 entry's
    code (docker/versions.env), on an L4 (compute capability 8.9)."""
    from lab.common import versions
    m = versions.read()
    engine_with({t: FakeImage(t, m["CUDA_13_0_ARCHS"], m["CUDA_13_0_PTX"]) for t in tags}, ["8.9"])


@pytest.mark.parametrize("built,checked", [
    (["dl-lab-kit:gpu-mpi"], ["dl-lab-kit:gpu-mpi"]),
    (["dl-lab-kit:gpu-nccl", "dl-lab-kit:gpu-mpi"], ["dl-lab-kit:gpu-nccl", "dl-lab-kit:gpu-mpi"]),
])
def test_doctor_checks_whichever_gpu_images_are_built(monkeypatch, engine_with, built, checked):
    from lab.host.suites import doctor
    gpus = probes.parse_nvidia_smi((FIX / "nvidia-smi-1x-l4.txt").read_text())
    monkeypatch.setattr(host, "collect", lambda: [Result("gpus", PASS, gpus)])
    _engine_with(engine_with, built)
    seen = []

    def in_image(runner, np):
        seen.append(runner.tag)
        return [dict(Result("torch", PASS, {"cuda_build": "13.0", "cuda_available": True,
                                            "device_count": 1}).as_dict(), where="image")]
    monkeypatch.setattr(doctor, "stack_in_image", in_image)
    checks, _, notes = doctor.run(np=2, echo=lambda line: None)
    assert seen == checked
    assert all(f"the stack is checked in the image {t}" in " ".join(notes) for t in checked)
    if len(checked) == 2:       # each image's rows name it
        assert {c["where"] for c in checks if c["name"] == "torch"} == {f"image {t}" for t in checked}


@pytest.mark.parametrize("ops,status", [("NCCL", WARN), (None, WARN), ("MPI", FAIL)])
def test_an_mpi_that_cannot_take_gpu_memory_fails_only_where_horovod_gives_it_some(monkeypatch, ops, status):
    """mpirun ends non-zero when a rank hands a GPU buffer to a non-CUDA-aware MPI (the
    GPU run cannot happen here: run_command is made to fail as that mpirun does)."""
    def mpirun_fails(argv, timeout=10, env=None):
        raise probes.ProbeError("mpirun exited with 139: rank 0 ... Segmentation fault")
    monkeypatch.setattr(stack, "run_command", mpirun_fails)
    torch_r = Result("torch", PASS, {"cuda_build": "13.0", "cuda_available": True, "device_count": 1})
    hvd = Result("horovod", PASS, {"gpu_operations": ops})
    r = stack.probe_mpi_gpu_allreduce(torch_r, 2, hvd=hvd)
    assert r.status == status, r.fix
    assert ("--gpu-ops MPI" in r.fix) and (("use NCCL GPU operations" in r.fix) is False)



def test_this_machine_lists_the_rdma_checks_as_skip_with_reasons():
    """No GPU and no RDMA device here: every GPUDirect RDMA check is a SKIP that says why."""
    checks = {r.name: r for r in host.collect()}
    for name in ("rdma_devices", "gpudirect_peermem", "gpu_nic_affinity", "nccl_rdma_settings"):
        assert checks[name].status == SKIP and checks[name].fix, name


def test_doctor_on_a_cdi_only_host_exits_0(monkeypatch, tmp_path, capsys):
    """One GPU (the L4 capture), an engine with no lab image yet, and the container
    toolkit's CDI hook and spec but no nvidia-container-runtime-hook: the engine can give
    containers GPUs (moby registers "gpu" for the CDI hook), so no FAIL."""
    from lab.common import docker_api
    _fake_gpu_host(monkeypatch, tmp_path, "nvidia-smi-1x-l4.txt", gpus_seen=1, docker=True)
    import docker

    class Images:
        def list(self, name=None):
            return []

        def get(self, tag):
            raise docker.errors.ImageNotFound(tag)

    class Engine:
        images = Images()

        def version(self):
            return {"Version": "29.2.0", "ApiVersion": "1.52"}
    monkeypatch.setattr(docker_api, "client", lambda *a, **k: Engine())
    _fake(tmp_path / "bin" / "nvidia-cdi-hook", "exit 0")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = (FIX / "cdi-spec-nvidia-ctk-generate.yaml").read_text()
    (cdi / "nvidia.yaml").write_text(spec.replace("kind: example.com/device", "kind: nvidia.com/gpu"))
    monkeypatch.setattr(host, "CDI_DIRS", (str(cdi),))
    code, checks = _doctor_json(capsys)
    runtime = checks[("host", "gpu_container_runtime")]
    assert runtime["status"] == PASS and runtime["value"]["cdi_specs"] == [str(cdi / "nvidia.yaml")]
    assert code == 0, [c for c in checks.values() if c["status"] == FAIL]


def test_more_ranks_than_cores_is_a_warning_with_the_count():
    from envcheck import findings
    from envcheck.probes import PASS as OK
    from envcheck.probes import WARN as WARNED
    [core] = [r for r in findings.find({}, {}, 4, False, cores=2) if r.name == "finding: a core per rank"]
    assert core.status == WARNED and core.value == {"np": 4, "cores": 2}
    assert "4 ranks on 2 core(s)" in core.fix and "--np 2 or fewer" in core.fix
    [fits] = [r for r in findings.find({}, {}, 2, False, cores=2) if r.name == "finding: a core per rank"]
    assert fits.status == OK


def test_the_collectives_across_a_slow_link_leave_out_the_sizes_it_cannot_move_in_time():
    from lab.host.suites.doctor import ACROSS_SIZES, across_sizes
    assert across_sizes(None) == list(ACROSS_SIZES) == across_sizes(0.125)   # 1 Gbit/s: 16 MiB in 0.13 s
    assert across_sizes(0.025) == [65536, 1048576]                          # 200 Mbit/s
    assert across_sizes(1.25e-4) == [4096]                                  # 1 Mbit/s


def test_doctor_nodes_below_two_is_one_sentence():
    cp = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--local", "--nodes", "1"],
                        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert "--nodes times the collectives across the cluster: give 2 or more" in cp.stderr


def test_doctor_across_nodes_without_the_cluster_is_one_sentence_before_any_probe(monkeypatch):
    """No cluster of this checkout's test project is up here (its tests bring one up in
    their own module): refused at once, not after the host and stack checks."""
    import time
    env = dict(os.environ, COMPOSE_PROJECT_NAME="labtest-none-up")
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--local", "--nodes", "2",
                         "--link", "1gbit"], capture_output=True, text=True, cwd=REPO, timeout=120,
                        env=env)
    assert cp.returncode == 2, cp.stdout[-1000:] + cp.stderr
    assert "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "invoke up --nodes 2" in cp.stderr or "Docker" in cp.stderr, cp.stderr
    assert "collectives" not in cp.stdout          # no probe ran
    assert time.monotonic() - t0 < 60
