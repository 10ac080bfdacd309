"""The test tiers of conftest.py: a unit test that trains or starts a process fails and says to mark it slow, slow
tests are left alone, unit tests get the unit timeout, and a test marked both unit and slow is refused."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from condattn.engine import provenance
from condattn.engine.loop import StepLoop

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
FIX = "mark it @pytest.mark.slow"


def test_the_guard_refuses_training_and_every_way_to_start_a_process():
    with pytest.raises(RuntimeError, match=f"subprocess in a unit test: {FIX}"):
        subprocess.run(["true"], check=True)
    with pytest.raises(RuntimeError, match=FIX):
        provenance.git_commit()  # its `except OSError` must not hide the guard
    with pytest.raises(RuntimeError, match=f"multiprocessing process in a unit test: {FIX}"):
        multiprocessing.Process(target=print).start()
    with pytest.raises(RuntimeError, match=f"os.fork in a unit test: {FIX}"):
        os.fork()
    with pytest.raises(RuntimeError, match=rf"training \(StepLoop.train\) in a unit test: {FIX}"):
        StepLoop.train(object())


def _inner(pytester: pytest.Pytester, unit_guard: pytest.MonkeyPatch, test: str) -> pytest.RunResult:
    """Run `test` in a pytest session of its own, under this conftest."""
    unit_guard.undo()  # this test's own guard off, so that the inner session's decides
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n  unit: u\n  slow: s\n  gpu: g\n")
    return pytester.runpytest_inprocess(pytester.makepyfile(test), "-p", "no:cacheprovider")


def test_an_unmarked_test_or_its_fixture_that_starts_a_process_fails_and_a_slow_one_does_not(pytester, unit_guard):
    result = _inner(pytester, unit_guard, """
        import subprocess
        import pytest

        def test_unmarked():
            subprocess.run(["true"])

        @pytest.fixture(scope="module")
        def spawned():
            subprocess.run(["true"])

        def test_unmarked_through_a_module_fixture(spawned):
            pass

        @pytest.mark.slow
        def test_slow_is_not_guarded(request):
            assert subprocess.Popen._execute_child.__name__ == "_execute_child"
            assert not request.node.get_closest_marker("unit")

        def test_unit_gets_the_unit_timeout(request):
            assert request.node.get_closest_marker("unit")
            assert request.node.get_closest_marker("timeout").args == (60,)
    """)
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines([f"E * a subprocess in a unit test: {FIX}*", "FAILED *::test_unmarked*",
                                 "ERROR *::test_unmarked_through_a_module_fixture*"])


def test_a_test_in_two_tiers_is_refused(pytester, unit_guard):
    result = _inner(pytester, unit_guard, """
        import pytest

        @pytest.mark.unit
        @pytest.mark.slow
        def test_both():
            pass
    """)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_both: marked unit and slow*"])


def test_slow_tests_over_their_budget_are_listed_with_their_setup(pytester, unit_guard):
    """The run lists slow-tier tests over SLOW_BUDGET_S, a costly fixture counted as its test's (budget set to 0.05 s
    here: a 0.1-s fixture lists its test, a quick one is not listed)."""
    unit_guard.undo()
    assert "SLOW_BUDGET_S = 10.0" in CONFTEST
    pytester.makeconftest(CONFTEST.replace("SLOW_BUDGET_S = 10.0", "SLOW_BUDGET_S = 0.05"))
    pytester.makeini("[pytest]\nmarkers =\n  unit: u\n  slow: s\n  gpu: g\n")
    result = pytester.runpytest_inprocess(pytester.makepyfile("""
        import time, pytest

        @pytest.fixture
        def costly():
            time.sleep(0.1)

        @pytest.mark.slow
        def test_costly_setup(costly):
            pass

        @pytest.mark.slow
        def test_quick():
            pass
    """), "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "slow tests over 0.05 s, setup included" in out and "test_costly_setup" in out, out
    assert "test_quick" not in out.split("slow tests over")[1]


def test_ci_runs_the_unit_tier_again_on_other_kernels():
    """.ci/run: the README's two commands, then the unit tier under torch's plain kernels, and under AVX2 where the
    machine's torch picks AVX-512, each named in the log."""
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    steps = ("make install", "run_with_empty_caches make test\n", 'kernels="default"', 'kernels="default avx2"',
             "ATEN_CPU_CAPABILITY=$k run_with_empty_caches make test-unit")
    order = [ci.index(s) for s in steps]
    assert order == sorted(order)
    assert '[[ "$picked" == AVX512* ]]' in ci and 'echo "CI: make test-unit with ATEN_CPU_CAPABILITY=$k"' in ci
