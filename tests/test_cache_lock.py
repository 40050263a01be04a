"""The wheel and venv caches the test lanes share (tests/validate_support.made_once): two pytest processes that
ask for the same folder at once get one maker, and the second waits for the folder to be whole instead of deleting
it under the first (scripts/dev.sh test runs three lanes over one cache)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKER = r'''
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import validate_support as vs
d, log, locked = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"

def make(d):
    d.mkdir(parents=True)
    with open(log, "a") as f:
        f.write("make\n")
    time.sleep(1.5)                       # the window another process would fall into
    (d / "payload").write_text("whole")

if locked:
    vs.made_once(d, make)
else:                                     # the check-then-make the helpers did before the lock
    if not (d / ".ready").is_file():
        import shutil
        shutil.rmtree(d, ignore_errors=True)
        make(d)
        (d / ".ready").write_text("ok")
print((d / "payload").read_text())
'''


def _race(tmp_path: Path, locked: bool) -> tuple[list[str], list[subprocess.CompletedProcess]]:
    d, log = tmp_path / "cache" / "target", tmp_path / "makes.log"
    procs = []
    for _ in range(2):
        procs.append(subprocess.Popen([sys.executable, "-c", MAKER, str(ROOT / "tests"), str(d), str(log),
                                       "1" if locked else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        time.sleep(0.3)
    done = [subprocess.CompletedProcess(p.args, p.wait(timeout=60), *p.communicate()) for p in procs]
    return log.read_text().split(), done


def test_two_processes_get_one_maker_and_both_read_a_whole_folder(tmp_path):
    makes, done = _race(tmp_path, locked=True)
    assert makes == ["make"], makes
    assert all(p.returncode == 0 and p.stdout.strip() == "whole" for p in done), [p.stderr[-500:] for p in done]


def test_twin_without_the_lock_both_processes_make_it(tmp_path):
    makes, _ = _race(tmp_path, locked=False)
    assert makes == ["make", "make"], makes
