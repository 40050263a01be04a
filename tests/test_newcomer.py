"""A newcomer's first hour, as tests: set-up does what the README and scripts/dev.sh say, tests use only
their own image names, `invoke --list` reads whole sentences, the tasks write only where .gitignore covers,
the dry run prints the MAX_JOBS the build uses, and a build ends with the runtime image tag."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
DIGEST = "sha256:" + "ab" * 32

#: an image reference under the stack's own repository prefix (``cudastack/<name>:<tag>`` or ``@sha256:``)
STACK_NAME = re.compile(r"(?<![\w./-])cudastack/[A-Za-z0-9_.{}\-]+[:@]")


def stack_names_in(text: str) -> list[str]:
    """Image references under the stack's prefix ``cudastack/`` in ``text`` (file paths such as
    ``cudastack/plan/model.py`` are not references)."""
    return [m.group(0) for m in STACK_NAME.finditer(text) if not m.group(0)[:-1].endswith(".py")]


def test_stack_name_finder_finds_what_it_must():
    stack = "cudastack" + "/"   # spelled apart so that this file passes its own check
    assert stack_names_in(f'tag="{stack}app:1"; f"{stack}{{x}}:y"') == [f"{stack}app:", f"{stack}{{x}}:"]
    assert stack_names_in("cudastack-test/app:1 cudastack/model.py: 127.0.0.1:5000/ci/app:1") == []


def test_tests_use_only_test_image_names():
    """Tests tag only cudastack-test/...: no reference under the stack's cudastack/ names anywhere in tests/
    (a test image under the stack's name is later taken for a cached stack node)."""
    found = {}
    quoted = {TESTS / "data" / "readme_facts.txt"}   # the old README's text, quoted (committed reports' image names)
    for path in sorted(TESTS.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".toml", ".cfg", ".txt", "") \
                and "__pycache__" not in path.parts and path not in quoted:
            hits = stack_names_in(path.read_text(errors="replace"))
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert not found, f"use cudastack-test/... in tests: {found}"


def _invoke(*args: str, cwd: Path = ROOT, timeout: float = 600, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, **(env or {})))


def test_invoke_list_shows_whole_sentences():
    p = _invoke("--list")
    assert p.returncode == 0, p.stderr
    rows: dict[str, str] = {}
    name = None
    for line in p.stdout.splitlines()[1:]:
        m = re.match(r"  (\S+)\s+(.*)", line)
        if m:
            name = m.group(1)
            rows[name] = m.group(2)
        elif name and line.strip():
            rows[name] += " " + line.strip()
    assert {"build", "validate", "lock", "push", "pull", "cluster-job", "bake"} <= set(rows), rows
    cut = {n: d for n, d in rows.items() if not d.rstrip().endswith((".", ")"))}
    assert not cut, f"descriptions cut mid-sentence: {cut}"


def _scratch_checkout(tmp_path: Path) -> Path:
    """An empty git repository with this project's .gitignore: the tasks run there as in a checkout."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copy(ROOT / ".gitignore", work / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    return work


def _untracked(work: Path) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=work, check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if not line.endswith(".gitignore")]


@pytest.mark.network      # bake lists releases on PyPI
def test_tasks_leave_only_ignored_files(tmp_path):
    """cluster-job (both schedulers), bake and validate with their default outputs, run from another working
    directory: the outputs land under the project root (not the caller's directory), each one ignored by git
    there; validate writes its report under .stack/validate, not into results/."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    image = f"127.0.0.1:5000/ci/runtime@{DIGEST}"
    defaults = ["stackprobe-cu13.1.sbatch", "stackprobe-cu13.1.k8s.yaml", "bake/docker-bake.json",
                ".stack/validate/current-environment.json"]
    for rel in defaults:
        (ROOT / rel).unlink(missing_ok=True)
    runs = [
        ("cluster-job", "--cuda", "13.1", "--scheduler", "slurm", "--gpus", "8", "--image", image),
        ("cluster-job", "--cuda", "13.1", "--scheduler", "kubernetes", "--gpus", "8", "--image", image),
        ("bake", "--cuda", "13.1"),
        ("validate",),
    ]
    for args in runs:
        p = _invoke(*args, cwd=work)
        assert p.returncode == 0, (args, p.stderr[-2000:])
    assert sorted(work.rglob("*")) == []
    for rel in defaults:
        assert (ROOT / rel).is_file(), rel
        assert subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT).returncode == 0, rel


def test_memory_rule_reads_memtotal_not_memavailable():
    """The memory rule's input is MemTotal (or the cgroup limit), which a running compile does not move."""
    from cudastack.plan.rules import host_resources

    mem = {k: int(v.split()[0]) * 1024 for k, v in
           (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())}
    limits = [mem["MemTotal"]]
    cg = Path("/sys/fs/cgroup/memory.max")
    if cg.is_file() and cg.read_text().strip().isdigit():
        limits.append(int(cg.read_text()))
    res = host_resources()
    assert res.mem_gib == round(min(limits) / 2**30, 1), (res, mem["MemTotal"], mem["MemAvailable"])
    assert "MemAvailable" not in res.origin


@pytest.mark.docker      # the dry run rehearses the build's checks: it needs the engine the build would use
def test_dry_run_prints_the_max_jobs_the_build_uses():
    """The dry run asks the same builder as the build (cudastack.jobs.build._builder_resources) and so
    prints the build's MAX_JOBS."""
    from cudastack.plan.planner import make_plan
    from cudastack.jobs.build import _builder_resources

    res = _builder_resources()
    plan = make_plan(None, "13.1", resources=res)
    want = {k.name: k.value for k in plan.node("flash-attn").knobs}["MAX_JOBS"]
    for args in (("build", "--cuda", "13.1", "--dry-run"), ("plan", "--cuda", "13.1")):
        p = _invoke(*args)
        assert p.returncode == 0, p.stderr
        shown = re.search(r"knob\s+MAX_JOBS=(\d+)\s+\[memory-rule\]", p.stdout)
        assert shown and shown.group(1) == str(want), (args, p.stdout[-3000:])
        assert res is None or res.origin in p.stdout, (args, res)


def test_final_line_names_the_runtime_tag():
    from cudastack.jobs.build import final_line

    nodes = [{"name": "base", "kind": "base-pip", "tag": "cudastack-test/b:1"},
             {"name": "runtime", "kind": "runtime", "tag": "cudastack-test/rt:2"}]
    assert final_line({"nodes": nodes}) == "runtime image: cudastack-test/rt:2"
    assert final_line({"nodes": nodes[:1]}) == "last image (base): cudastack-test/b:1"


@pytest.mark.docker
@pytest.mark.network
def test_build_ends_with_the_runtime_tag(tmp_path):
    """`invoke build` of the fixture chain (cached after tests/test_build_integration.py) prints the runtime
    image's tag as its last line."""
    from cudastack.plan.planner import make_plan

    recipes = TESTS / "fixtures" / "recipes"
    p = _invoke("build", "--cuda", "13.1", "--recipes", str(recipes), "--prefix", "cudastack-test",
                "--state-dir", str(tmp_path / "state"), timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    tag = make_plan(recipes, "13.1", prefix="cudastack-test").node("runtime").tag
    assert p.stdout.strip().splitlines()[-1] == f"runtime image: {tag}", p.stdout


# ------------------------------------------------------------------------------------------- set-up
def _dev_sh_installs() -> set[str]:
    """Debian packages scripts/dev.sh installs when missing (its ``|| need PACKAGE`` lines)."""
    return set(re.findall(r"\|\|\s*need ([\w.-]+)", (ROOT / "scripts" / "dev.sh").read_text()))


def test_dev_sh_installs_what_it_says():
    text = (ROOT / "scripts" / "dev.sh").read_text()
    said = re.search(r"# Set-up \(idempotent\): (.*?)a running Docker daemon", text, re.S).group(1)
    names = set(re.findall(r"(?<![\w'])[a-z][\w.-]*\w", said)) - {"for", "and", "with"}
    aliases = {"htpasswd": "apache2-utils", "objdump": "binutils"}
    installs = _dev_sh_installs()
    missing = {n for n in names if aliases.get(n, n) not in installs}
    assert not missing, f"scripts/dev.sh says it installs {sorted(missing)} but does not"


def test_readme_setup_claims_match_dev_sh():
    """The README's "two commands" paragraph names exactly the packages scripts/dev.sh installs."""
    readme = " ".join((ROOT / "README.md").read_text().split("## The two commands", 1)[1].split("```", 1)[0].split())
    listed = readme.split("install what is missing of Debian's ", 1)[1].split(", start the Docker daemon", 1)[0]
    named = {re.sub(r"\s*\(.*?\)", "", item).strip() for item in re.split(r",\s*|\s+and\s+", listed)}
    assert named == _dev_sh_installs(), (named, _dev_sh_installs())
