"""tests/conftest.py's wait for an image that CI builds beside the tests (.ci/run's
LAB_TEST_PENDING_IMAGES): a test of it neither skips as "not built" nor reads an older
image while the build is under way, and fails when that build failed."""
import threading
import time

import pytest

from tests import conftest


@pytest.fixture
def pending(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_TEST_PENDING_IMAGES", str(tmp_path))
    monkeypatch.setattr(conftest, "PENDING_IMAGES_POLL_S", 0.05)
    return tmp_path


def test_outside_ci_it_returns_at_once(monkeypatch):
    monkeypatch.delenv("LAB_TEST_PENDING_IMAGES", raising=False)
    conftest.wait_for_pending_image("dl-lab-kit:gpu-nccl")


def test_it_waits_until_the_image_is_made(pending):
    t = threading.Timer(0.5, (pending / "dl-lab-kit_gpu-nccl").touch)
    t.start()
    start = time.monotonic()
    conftest.wait_for_pending_image("dl-lab-kit:gpu-nccl")
    assert time.monotonic() - start >= 0.4
    t.join()


def test_another_image_made_does_not_end_the_wait(pending, monkeypatch):
    (pending / "dl-lab-kit_gpu-nccl").touch()
    monkeypatch.setattr(conftest, "PENDING_IMAGES_WAIT_S", 0.3)
    with pytest.raises(pytest.fail.Exception, match="made nothing in 0.3 s"):
        conftest.wait_for_pending_image("dl-lab-kit:gpu-mpi")


def test_a_build_that_failed_before_making_it_fails_the_test(pending):
    (pending / "ended").write_text("2\n")
    with pytest.raises(pytest.fail.Exception, match=r"the image build beside the tests failed \(exit 2\)"):
        conftest.wait_for_pending_image("dl-lab-kit:gpu-mpi")


def test_an_image_made_before_the_build_failed_is_used(pending):
    (pending / "lab-base_cuda_13.0-devel-trixie").touch()
    (pending / "ended").write_text("1\n")
    conftest.wait_for_pending_image("lab-base/cuda:13.0-devel-trixie")


def test_a_build_that_ended_well_lets_the_test_look_for_itself(pending):
    (pending / "ended").write_text("0\n")       # no CUDA toolkit: nothing made, the test skips itself
    conftest.wait_for_pending_image("dl-lab-kit:gpu-mpi")
