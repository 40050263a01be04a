"""The command line's conventions (cudastack/cli/common.py), for every task: one StackError -> exit-code mapping,
whole-number and choice flags refused in one line with exit 2 while parsing, defaults in --help, default outputs
under the project root, and the `cudastack` console script with --version. Each is shown failing without the
convention (a plain invoke task) as well as holding with it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection, Program, task

from cudastack.cli.common import StackTask, stack_task
from cudastack.cli.main import namespace, version
from cudastack.core.errors import LockError

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _program(*tasks) -> Program:
    ns = Collection()
    for t in tasks:
        ns.add_task(t)
    return Program(namespace=ns, name="t", binary="t")


def test_every_task_uses_the_one_mapping():
    ns = namespace()
    assert sorted(ns.tasks) == ["bake", "bootstrap-base", "build", "cluster-job", "lock", "outdated", "plan", "pull",
                                "push", "scan", "validate"]
    assert all(isinstance(t, StackTask) for t in ns.tasks.values())


def test_a_stack_error_becomes_its_exit_code_and_one_line(capsys):
    @stack_task()
    def stale(c):
        raise LockError("the lock is stale")

    with pytest.raises(SystemExit) as e:
        _program(stale).run(["t", "stale"])
    assert e.value.code == LockError.exit_code == 7
    assert capsys.readouterr().err.strip() == "error: the lock is stale"


def test_bad_whole_number_and_choice_values_are_usage_errors_a_plain_task_is_not(capsys):
    @stack_task(choices={"topology": ("pcie", "nvlink")}, ints=["gpus"])
    def good(c, world_size=8, topology="pcie", gpus=None):
        print(world_size, topology, gpus)

    @task
    def plain(c, world_size=8):
        pass

    _program(good).run(["t", "good", "--world-size", "4", "--topology", "nvlink", "--gpus", "2"])
    assert capsys.readouterr().out.strip() == "4 nvlink 2"
    for argv, msg in ((["--world-size", "x"], "error: --world-size 'x': give a whole number."),
                      (["--gpus", "2.5"], "error: --gpus '2.5': give a whole number."),
                      (["--topology", "ring"], "error: --topology 'ring': use one of pcie, nvlink.")):
        with pytest.raises(SystemExit) as e:
            _program(good).run(["t", "good", *argv])
        assert e.value.code == 2 and capsys.readouterr().err.strip() == msg
    with pytest.raises(ValueError):            # without the convention: a traceback, not a usage error
        _program(plain).run(["t", "plain", "--world-size", "x"])


def test_a_choice_default_outside_its_choices_is_refused_at_definition():
    with pytest.raises(ValueError, match="topology"):
        @stack_task(choices={"topology": ("pcie", "nvlink")})
        def bad(c, topology="ring"):
            pass


def test_help_shows_defaults_and_choices():
    t = namespace().tasks["build"]
    assert "(default: 13.1)" in t.help["cuda"]
    assert "'source' (default" in t.help["builder_nodes"]          # said already: nothing appended
    assert "in the project root" in namespace().tasks["validate"].help["out"]

    @stack_task(help={"n": "How many."}, choices={"mode": ("fast", "slow")})
    def plain_help(c, n=3, flag=False, name=None, mode="fast"):
        pass

    assert plain_help.help == {"n": "How many. (default: 3)", "mode": "One of: fast, slow. (default: fast)"}


def test_default_outputs_land_under_the_project_root_given_paths_stay_relative(tmp_path, monkeypatch):
    seen = {}

    @stack_task(root_defaults=["out"])
    def write(c, out=".stack/x"):
        seen["out"] = out

    monkeypatch.chdir(tmp_path)
    _program(write).run(["t", "write"])
    assert seen["out"] == str(ROOT / ".stack/x")
    _program(write).run(["t", "write", "--out", "here"])
    assert seen["out"] == "here"


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'validate'}")
    return subprocess.run([str(BIN / "cudastack"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.mark.skipif(not (BIN / "cudastack").exists(), reason="the console script is installed by pip install -e .")
def test_the_console_script_runs_the_tasks_with_version_and_usage_errors(tmp_path):
    v = _cli("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"cudastack {version()}" and version() != "unknown"
    listed = _cli("--list")
    assert listed.returncode == 0 and "cluster-job" in listed.stdout and "validate" in listed.stdout
    bad = _cli("validate", "--world-size", "x", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --world-size 'x': give a whole number."
    assert "Traceback" not in bad.stderr
    job = _cli("cluster-job", "--scheduler", "pbs", cwd=tmp_path)
    assert job.returncode == 2 and "use one of slurm, kubernetes" in job.stderr
    plan = _cli("plan", "--cuda", "13.1", "--max-jobs", "two", cwd=tmp_path)
    assert plan.returncode == 2 and "--max-jobs 'two'" in plan.stderr


@pytest.mark.parametrize("args", [("plan", "--cuda", "13.1", "--arch", "12.O"), ("validate", "--arch", "12.O"),
                                  ("scan", "--package", "flashinfer-python", "--arch", "12.O"),
                                  ("outdated", "--cuda", "13.1", "--no-verdicts", "--arch", "12.O")])
def test_a_bad_arch_exits_4_on_every_task_that_takes_one(args, tmp_path):
    """README "Exit codes": 4 for a bad or impossible arch, from every task with --arch, before any work (the
    index is unreachable here: nothing may be fetched first)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'validate'}",
               CUDASTACK_INDEX="http://127.0.0.1:9/simple")
    p = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr and "12.O" in p.stderr and "validating" not in p.stderr
