"""A stop during the OS image's bootstrap leaves nothing behind (found when a real 13.1 build was interrupted while
mmdebstrap installed the essential packages: the chroot's /proc, /sys, /dev/pts and /dev/shm stayed mounted and its
290 MB temp dir stayed in /tmp; the tool had been killed by SIGPIPE in its clean-up). Real mmdebstrap from the
Debian mirror, interrupted as a terminal interrupts it (SIGINT to the whole process group) once it has mounted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.network
@pytest.mark.docker
def test_an_interrupted_bootstrap_unmounts_and_removes_its_temp_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the bootstrap needs root")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tag = f"cudastack-test/debian-interrupted:{uuid.uuid4().hex[:8]}"
    script = ("import sys\nfrom cudastack.jobs.build import _sigterm_as_interrupt\n_sigterm_as_interrupt()\n"
              "from cudastack.osimage.bootstrap import bootstrap_os_image\n"
              "try:\n"
              f"    bootstrap_os_image('bookworm', tag={tag!r}, progress=lambda s: print(s, flush=True))\n"
              "except KeyboardInterrupt:\n    print('STOPPED', flush=True); sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        seen.append(line)
        if "installing essential packages" in line or "installing remaining packages" in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    mounted = [ln for ln in Path("/proc/mounts").read_text().splitlines() if str(tmp) in ln]
    assert mounted, "the chroot should be mounted by now: " + "".join(seen[-5:])
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
    out = "".join(seen) + rest
    assert proc.returncode == 130 and "STOPPED" in out, out[-2000:]
    assert not [ln for ln in Path("/proc/mounts").read_text().splitlines() if str(tmp) in ln], out[-2000:]
    left = [p for p in tmp.iterdir() if p.name.startswith("mmdebstrap.") and "gpghome" not in p.name]
    assert not left, f"left behind: {left}\n{out[-2000:]}"
