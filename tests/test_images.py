"""Images: the Dockerfiles in images/ built for real through BuildKit, and the OS bootstrap.

No-Docker tests lint the Dockerfiles against the node-kind contract (cudastack/plan/model.py). The docker tests
build the real chain for CUDA 13.1 on a debootstrapped Debian (a toolkit subset keeps them small):
base-pip -> (image node) ; base-pip -> wheels (the cuda_ext fixture from source, sm_120) -> runtime,
and check inside the images what the toolchain layer promises: nvcc 13.1, sm_120 in its GPU code list,
host code including thrust compiles (case C7), links against libcudart/libcuda work, the CA bundle is in no
layer, and the fixture's shared object carries sm_120 SASS (cuobjdump from PyPI's nvidia-cuda-cuobjdump, a
test-only download: the CUDA 13.1 wheel set has no cuobjdump; the package exists on PyPI from 13.2 on).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import time
from email.utils import parsedate_to_datetime
from functools import lru_cache
from pathlib import Path

import pytest

from cudastack.plan.model import NODE_KINDS

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
FIXTURES = ROOT / "tests" / "fixtures"
CUDA13_SPECS = "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.1.1"
CUDA13_VERSION = "13.1.1"
CUDA12_SPECS = "nvidia-cuda-runtime-cu12==12.8.90 nvidia-cuda-nvcc-cu12==12.8.93 nvidia-cuda-cccl-cu12==12.8.90"
CUOBJDUMP_SPEC = "nvidia-cuda-cuobjdump==13.5.37"
TEST_REPO = "cudastack-test"

# Build args each kind must declare (cudastack/plan/model.py is the contract).
CONTRACT_ARGS = {
    "base-pip": {"OS_IMAGE", "CUDA_PIP_SPECS", "CUDA_VERSION", "CUDA_WHEEL_ROOT"},
    "base-nvidia": {"BASE_IMAGE", "CUDA_VERSION"},
    "image": {"PARENT_IMAGE", "PIP_SPECS", "BUILD_ENV"},
    "wheels": {"PARENT_IMAGE", "METHOD", "PIP_SPECS", "BUILD_ENV"},
    "runtime": {"PARENT_IMAGE", "PIP_SPECS", "WHEEL_NAMES", "FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"},
}


# ----------------------------------------------------------------------------------- Dockerfile lint
def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per Dockerfile instruction, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


@pytest.mark.parametrize("kind", NODE_KINDS)
def test_dockerfile_declares_contract_args(kind):
    path = IMAGES / f"{kind}.Dockerfile"
    assert path.is_file(), f"{path} missing for node kind {kind}"
    text = path.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I), "a '# syntax=' line pulls a frontend image"
    args = {rest.split("=")[0].strip() for ins, rest in _instructions(path) if ins == "ARG"}
    missing = CONTRACT_ARGS[kind] - args
    assert not missing, f"{kind}.Dockerfile does not declare ARG {sorted(missing)}"
    if kind not in ("base-pip", "base-nvidia"):
        assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"} <= args


@pytest.mark.parametrize("kind", NODE_KINDS)
def test_every_pip_call_uses_cache_mount_and_ca_secret(kind):
    path = IMAGES / f"{kind}.Dockerfile"
    pip_runs = [rest for ins, rest in _instructions(path)
                if ins == "RUN" and re.search(r"\bpip (install|download|wheel)\b", rest)]
    assert pip_runs, f"{kind}: no pip call found"
    for rest in pip_runs:
        assert "--mount=type=cache,target=/root/.cache/pip" in rest, rest[:120]
        assert "--mount=type=secret,id=cabundle" in rest, rest[:120]
        for call in re.findall(r"(\S+\s+)(?:nice -n \d+ )?pip (?:install|download|wheel)", rest):
            assert "with-build-ca" in call, f"{kind}: pip runs without the CA wrapper: {rest[:160]}"
    for ins, rest in _instructions(path):
        # the CA bundle reaches builds only as a secret: never copied, never in ENV
        assert not (ins in ("COPY", "ADD") and re.search(r"ca-?bundle|\.crt|\.pem", rest, re.I)), rest
        assert not (ins == "ENV" and re.search(r"PIP_CERT|SSL_CERT_FILE|REQUESTS_CA_BUNDLE", rest)), rest


@pytest.mark.parametrize("kind", NODE_KINDS)
def test_variables_in_from_env_label_are_declared(kind):
    path = IMAGES / f"{kind}.Dockerfile"
    declared: set[str] = set()
    for ins, rest in _instructions(path):
        if ins == "ARG":
            declared.add(rest.split("=")[0].strip())
        elif ins == "ENV":
            declared |= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", rest))
        if ins in ("FROM", "ENV", "LABEL"):
            for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", rest):
                assert var in declared, f"{kind}.Dockerfile: ${var} used in {ins} before it is declared"


def test_both_bases_install_the_same_ca_wrapper():
    """Later nodes call /usr/local/bin/with-build-ca whatever the base: both bases must write the same script."""
    def wrapper(kind: str) -> str:
        runs = [rest for ins, rest in _instructions(IMAGES / f"{kind}.Dockerfile")
                if ins == "RUN" and "/usr/local/bin/with-build-ca" in rest and "printf" in rest]
        assert len(runs) == 1, kind
        return runs[0]

    assert wrapper("base-pip") == wrapper("base-nvidia")


def test_runtime_turns_every_env_scope_knob_into_env():
    """Each recipe knob of scope ``env`` reaches the runtime image: declared as ARG, and set as ENV only in its
    own ``-set`` stage, selected when the value is not empty."""
    from cudastack.recipes.load import load_recipes

    env_knobs = {c.arch_knob.knob for c in load_recipes(ROOT / "recipes").components.values()
                 if c.arch_knob and c.arch_knob.scope == "env"}
    assert env_knobs, "no env-scope knob in the recipes"
    text = (IMAGES / "runtime.Dockerfile").read_text()
    for knob in env_knobs:
        assert re.search(rf"^ARG {knob}\b", text, re.M), knob
        assert re.search(rf'^ENV {knob}="\$\{{{knob}\}}"$', text, re.M), knob
        assert re.search(rf"^FROM \S+\$\{{{knob}:\+-set\}} AS ", text, re.M), knob


def test_build_env_quoting_contract():
    """BUILD_ENV is evaluated as `export $BUILD_ENV` by /bin/sh: a shell-quoted value keeps its spaces."""
    sh = shutil.which("sh")
    assert sh
    out = subprocess.run([sh, "-c", 'eval "export $BUILD_ENV"; printf "%s|%s" "$A" "$B"'],
                         env={"BUILD_ENV": "A=1 B='12.0a 12.1a'", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out == "1|12.0a 12.1a"


# ---------------------------------------------------------------------------------- real builds


@pytest.fixture(scope="session")
def engine():
    from cudastack.build.engine import Engine

    return Engine.connect()


@pytest.fixture(scope="session")
def ca_bundle():
    from cudastack.build.engine import default_ca_bundle

    return default_ca_bundle()


@pytest.fixture(scope="session")
def build(engine, ca_bundle, tmp_path_factory):
    """build(name, kind, context, **kw) -> BuildResult: one real BuildKit build of images/<kind>.Dockerfile."""
    logs = tmp_path_factory.mktemp("buildlogs")

    def _build(name: str, kind: str, context: Path, **kw):
        secrets = {"cabundle": ca_bundle} if ca_bundle else {}
        t0 = time.monotonic()
        res = engine.build(name=name, log_path=logs / f"{name}.log", say=lambda s: None, context=str(context),
                           dockerfile=str(IMAGES / f"{kind}.Dockerfile"), secrets=secrets, **kw)
        print(f"[build] {name}: {time.monotonic() - t0:.1f}s")
        return res

    return _build


@pytest.fixture(scope="session")
def empty_ctx(tmp_path_factory):
    return tmp_path_factory.mktemp("emptyctx")


@pytest.fixture(scope="session")
def os_image():
    """The bootstrapped Debian bookworm image (mmdebstrap + docker load; reused when its tag exists)."""
    from cudastack.osimage.bootstrap import bootstrap_os_image, release_info

    lines: list[str] = []
    tag = f"{TEST_REPO}/debian:bookworm-{release_info('bookworm')['date']}"   # the tests' name, not the stack's
    image_id = bootstrap_os_image("bookworm", tag=tag, progress=lines.append)
    return {"id": image_id, "tag": tag, "lines": lines}


@lru_cache(maxsize=1)
def _docker_bin() -> str:
    from cudastack.build.engine import find_buildkit

    return find_buildkit().docker


def _client():
    from cudastack.core.docker_engine import docker_client

    return docker_client()


def _run(image: str, script: str, *, volumes: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``bash -c script`` in a throwaway container (no GPU); returns the completed process."""
    cmd = [_docker_bin(), "run", "--rm"]
    for host, spec in (volumes or {}).items():
        cmd += ["-v", f"{host}:{spec}"]
    cmd += [image, "bash", "-c", script]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and res.returncode != 0:
        raise AssertionError(f"in {image}: {script}\nexit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


@pytest.fixture(scope="session")
def base13(build, os_image, empty_ctx):
    tag = f"{TEST_REPO}/base-pip:cu13.1"
    build("base-pip-cu13.1", "base-pip", empty_ctx, tag=tag, build_args={
        "OS_IMAGE": os_image["tag"], "CUDA_PIP_SPECS": CUDA13_SPECS, "CUDA_VERSION": CUDA13_VERSION,
        "CUDA_WHEEL_ROOT": "nvidia/cu13"})
    return tag


@pytest.fixture(scope="session")
def fixture_wheelhouse(build, base13, tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse")
    build("cuda-ext-wheels", "wheels", FIXTURES, target="wheels", output_dir=str(out), build_args={
        "PARENT_IMAGE": base13, "METHOD": "source", "PIP_SPECS": "./cuda_ext",
        "BUILD_ENV": "CUDA_EXT_ARCHS=120 MAX_JOBS=1 NVCC_THREADS=1"})
    return out


@pytest.fixture(scope="session")
def runtime13(build, base13, fixture_wheelhouse, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("runtimectx")
    shutil.copytree(fixture_wheelhouse, ctx / "wheelhouse")
    shutil.copytree(ROOT / "validate" / "stackprobe", ctx / "stackprobe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheels = sorted(p.name for p in fixture_wheelhouse.glob("*.whl"))
    tag = f"{TEST_REPO}/runtime:cu13.1"
    build("runtime-cu13.1", "runtime", ctx, tag=tag, build_args={
        "PARENT_IMAGE": base13, "WHEEL_NAMES": " ".join(wheels), "PIP_SPECS": "",
        "FLASHINFER_CUDA_ARCH_LIST": "12.0f"})
    return tag


# --- bootstrap -------------------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.network
def test_bootstrap_is_idempotent_and_recorded(os_image):
    from cudastack.osimage.bootstrap import bootstrap_os_image, default_tag, os_image_record

    lines: list[str] = []
    t0 = time.monotonic()
    # A missing tool would raise if the second call tried to bootstrap again.
    again = bootstrap_os_image("bookworm", tag=os_image["tag"], progress=lines.append,
                               tool="/nonexistent/mmdebstrap")
    assert again == os_image["id"]
    assert time.monotonic() - t0 < 30
    assert any("skipping the bootstrap" in s for s in lines), lines
    rec = os_image_record(os_image["tag"])
    assert rec["image_id"] == os_image["id"]
    assert rec["suite"] == "bookworm" and rec["variant"] == "minbase"
    assert rec["mirror"].startswith("http") and re.fullmatch(r"[0-9a-f]{64}", rec["release-sha256"])
    date = parsedate_to_datetime(rec["release-date"]).strftime("%Y%m%d")
    assert os_image["tag"].endswith("-" + date)
    assert default_tag("bookworm", date).endswith(f"/debian:bookworm-{date}")   # the stack's own OS image name
    assert rec["tool"].startswith("mmdebstrap ")
    # explicit tag: no network, no bootstrap
    assert bootstrap_os_image(tag=os_image["tag"], tool="/nonexistent/mmdebstrap") == os_image["id"]


@pytest.mark.docker
def test_bootstrap_errors_before_any_download(monkeypatch):
    from cudastack.osimage import bootstrap
    from cudastack.core.errors import EnvironmentError_, UsageError

    tag = f"{TEST_REPO}/never:built"
    with pytest.raises(EnvironmentError_, match="mmdebstrap was not found.*apt-get install mmdebstrap"):
        bootstrap.bootstrap_os_image(tag=tag, tool="/nonexistent/mmdebstrap")
    with pytest.raises(EnvironmentError_, match="apt-get install debootstrap"):
        bootstrap.bootstrap_os_image(tag=tag, tool="/nonexistent/debootstrap")
    with pytest.raises(UsageError, match="not a Debian suite"):
        bootstrap.bootstrap_os_image("book worm", tag=tag)
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 1000)
    with pytest.raises(EnvironmentError_, match="needs root"):
        bootstrap.bootstrap_os_image(tag=tag)


@pytest.mark.network
def test_release_info_names_the_snapshot():
    from cudastack.osimage.bootstrap import release_info
    from cudastack.core.errors import UsageError

    info = release_info("bookworm")
    assert re.fullmatch(r"20\d{6}", info["date"]) and info["codename"] == "bookworm"
    with pytest.raises(UsageError, match="no suite"):
        release_info("no-such-suite-xyz")


# --- base-pip, CUDA 13.1 ---------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.network
def test_base_pip_cuda13_toolchain(base13):
    img = _client().images.get(base13)
    labels = img.labels
    assert labels["org.cudastack.cuda.version"] == CUDA13_VERSION
    assert labels["org.cudastack.kind"] == "base-pip"
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert env["CUDA_HOME"] == "/usr/local/cuda" and env["PATH"].startswith("/opt/venv/bin:/usr/local/cuda/bin")
    assert "cabundle" not in json.dumps(img.attrs["Config"])
    out = _run(base13, "nvcc --version; echo ---; nvcc --list-gpu-code; echo ---; "
                       "python -c 'import sys; print(sys.prefix, sys.version_info[:2] >= (3, 11))'; "
                       "test ! -e /usr/local/cuda/NO_NVCC && echo has-nvcc; "
                       "pip list --path /opt/venv/lib/python3*/site-packages 2>/dev/null | grep -ci cuda-toolkit || true").stdout
    version, gpu_codes, rest = out.split("---")
    assert "release 13.1," in version
    assert "sm_120" in gpu_codes.split()
    assert "/opt/venv True" in rest and "has-nvcc" in rest
    assert rest.strip().endswith("0"), "the toolkit wheels must not be installed into the venv"


C7_CU = r"""
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <cstdio>
__global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }
int main() {
  thrust::host_vector<int> v(4, 1);
  printf("sum=%d\n", thrust::reduce(v.begin(), v.end()));
  float* d = nullptr;
  printf("malloc=%d\n", (int)cudaMalloc(&d, 16));
  return 0;
}
"""
C7_CPP = r"""
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#include <thrust/execution_policy.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <cstdio>
int main() {
  thrust::host_vector<int> v(4, 2);
  printf("sum=%d\n", thrust::reduce(thrust::host, v.begin(), v.end()));
  return 0;
}
"""
SHARED_CU = r"""
__global__ void inc(int* x) { x[threadIdx.x] += 1; }
extern "C" int launch(int* x) { inc<<<1, 1>>>(x); return (int)cudaGetLastError(); }
"""
DRIVER_CPP = r"""
#include <cuda.h>
#include <cstdio>
int main() { printf("cuInit=%d\n", (int)cuInit(0)); return 0; }
"""


@pytest.mark.docker
@pytest.mark.network
def test_c7_thrust_host_code_compiles_and_links_for_sm120(base13, tmp_path):
    (tmp_path / "t.cu").write_text(C7_CU)
    (tmp_path / "h.cpp").write_text(C7_CPP)
    (tmp_path / "d.cpp").write_text(DRIVER_CPP)
    (tmp_path / "k.cu").write_text(SHARED_CU)
    script = (
        "set -e; cd /src; cp t.cu h.cpp d.cpp k.cu /tmp; cd /tmp; "
        # nvcc: device code for sm_120, host code including thrust, linked into an executable
        "nice nvcc -gencode arch=compute_120,code=sm_120 -o t t.cu; ./t; "
        # g++ alone (host-only code, only -I$CUDA_HOME/include): thrust found through the base's include path;
        # links libcudart.so (the unversioned link) and runs
        "g++ -std=c++17 -I$CUDA_HOME/include -o h h.cpp -L$CUDA_HOME/lib64 -lcudart; ./h; "
        # the driver API links against the generated stub (-lcuda); it cannot run without a driver
        "g++ -I$CUDA_HOME/include -o d d.cpp -L$CUDA_HOME/lib64/stubs -lcuda; readelf -d d | grep NEEDED; "
        # a shared object against the shared runtime
        "nvcc -shared -Xcompiler -fPIC -cudart shared -gencode arch=compute_120,code=sm_120 -o libk.so k.cu; "
        "readelf -d libk.so | grep NEEDED; "
        "readelf -d $CUDA_HOME/lib/stubs/libcuda.so | grep SONAME; "
        # without the base's CCCL include path, host-only thrust code does not compile on CUDA 13 (C7)
        "if env -u CPLUS_INCLUDE_PATH g++ -std=c++17 -I$CUDA_HOME/include -c h.cpp -o /dev/null 2>err.txt; "
        "then echo C7-unneeded; else grep -o 'thrust/[a-z_]*.h: No such file' err.txt | head -1; fi"
    )
    out = _run(base13, script, volumes={str(tmp_path): "/src:ro"}).stdout
    assert "sum=4" in out and re.search(r"malloc=(35|100)\b", out), out  # no driver/GPU in the build container
    assert "sum=8" in out, out
    assert "Shared library: [libcuda.so.1]" in out and "Shared library: [libcudart.so.13]" in out, out
    assert "Shared library: [libcudart.so]" not in out, out
    assert "Library soname: [libcuda.so.1]" in out
    assert "No such file" in out and "C7-unneeded" not in out, out
    # the stub is for linking only: at run time the driver's libcuda.so.1 must be the one found
    ldd = _run(base13, "ldconfig -p | grep -c 'libcuda\\.so' || true; ls $LD_LIBRARY_PATH | grep -c '^libcuda\\.so' || true").stdout
    assert ldd.split() == ["0", "0"], ldd


_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)

# Run inside an image: print every certificate of the public CA bundles the image carries, each counted only
# when the image's own package database vouches for the file (so a host certificate appended to one of them
# is not taken for a public root): Debian's ca-certificates package (its files checked against dpkg's
# md5sums) and certifi (its own distribution or the copy pip vendors; checked against the sha256 in the
# installing distribution's RECORD, as the wheel spec defines it).
PUBLIC_BUNDLES_PY = r"""
import base64, csv, glob, hashlib, os, sys
out = sys.stdout.buffer
try:
    with open("/var/lib/dpkg/info/ca-certificates.md5sums") as fh:
        for line in fh:
            md5, path = line.split(None, 1)
            path = "/" + path.strip()
            if path.startswith("/usr/share/ca-certificates/") and path.endswith(".crt") and os.path.isfile(path):
                data = open(path, "rb").read()
                if hashlib.md5(data).hexdigest() == md5:
                    out.write(data + b"\n")
except FileNotFoundError:
    pass
records = []
for pat in ("/opt/*/lib/python3*/site-packages", "/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages"):
    for site in glob.glob(pat):
        records += glob.glob(os.path.join(site, "*.dist-info", "RECORD"))
for record in records:
    site = os.path.dirname(os.path.dirname(record))
    with open(record, newline="") as fh:
        for row in csv.reader(fh):
            if len(row) < 2 or not row[0].endswith("certifi/cacert.pem") or not row[1].startswith("sha256="):
                continue
            path = os.path.join(site, row[0])
            if not os.path.isfile(path):
                continue
            data = open(path, "rb").read()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if digest == row[1][len("sha256="):]:
                out.write(data + b"\n")
"""


def _der(pem: bytes) -> bytes:
    """The DER bytes of one PEM certificate (so line wrapping and comments do not matter)."""
    body = pem.split(b"-----")[2]
    return base64.b64decode(b"".join(body.split()))


def _ca_needles(bundle: bytes, public: bytes) -> list[bytes]:
    """One base64 line of each certificate of ``bundle`` (the host's CA bundle) found in no public bundle
    (``public``: the PEM text of the public bundles the image carries): the host's private part, such as an
    intercepting proxy's CA. A public root the host has and Debian's bundle lacks is not a needle when the
    image's certifi carries it (case C31)."""
    known = {_der(c) for c in _PEM.findall(public)}
    private = {_der(c): c for c in _PEM.findall(bundle)}
    return [c.splitlines()[len(c.splitlines()) // 2] for d, c in sorted(private.items()) if d not in known]


def _public_bundles(image: str) -> bytes:
    """The PEM text of the public CA bundles ``image`` carries (see PUBLIC_BUNDLES_PY)."""
    return _run(image, f"python3 - <<'PY'\n{PUBLIC_BUNDLES_PY}\nPY").stdout.encode()


def _ca_leaks(image: str, bundle: bytes, needles: list[bytes], tmp_path: Path) -> list[str]:
    """Files in any layer of ``image`` that equal ``bundle`` or hold one of ``needles`` in a PEM file; and
    history entries holding a certificate."""
    whole = hashlib.sha256(bundle).hexdigest()
    hits = []
    tar_path = tmp_path / "image.tar"
    img = _client().images.get(image)
    with open(tar_path, "wb") as fh:
        for chunk in img.save(named=False):
            fh.write(chunk)
    try:
        with tarfile.open(tar_path) as outer:
            for member in outer:
                if not member.name.endswith("layer.tar"):
                    continue
                with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                    for f in layer:
                        # a PEM bundle is a few hundred KiB: files over 8 MiB (compilers, libnvvm) are skipped
                        if not f.isfile() or f.size > 8 * 2**20:
                            continue
                        data = layer.extractfile(f).read()
                        if hashlib.sha256(data).hexdigest() == whole or (
                                b"-----BEGIN CERTIFICATE-----" in data and any(n in data for n in needles)):
                            hits.append(f"{member.name}: {f.name}")
    finally:
        tar_path.unlink()
    if b"BEGIN CERTIFICATE" in json.dumps(img.history()).encode():
        hits.append("image history")
    return hits


@pytest.fixture(scope="session")
def public_bundles(runtime13) -> bytes:
    """The public CA bundles the runtime image carries (Debian's ca-certificates, pip's certifi)."""
    text = _public_bundles(runtime13)
    assert text.count(b"BEGIN CERTIFICATE") > 100, "no public CA bundle found in the runtime image"
    return text


@pytest.fixture(scope="session")
def ca_needles(public_bundles, ca_bundle):
    assert ca_bundle, "no system CA bundle on this host (scripts/dev.sh installs ca-certificates)"
    return _ca_needles(Path(ca_bundle).read_bytes(), public_bundles)


@pytest.mark.docker
@pytest.mark.network
def test_ca_bundle_is_in_no_layer(runtime13, ca_bundle, ca_needles, tmp_path):
    """No file in any layer of the runtime image (which holds every layer of base13, its parent) equals the
    host's CA bundle or holds a certificate of the host's private part (in no public bundle the image
    carries); no history entry holds one."""
    assert _ca_leaks(runtime13, Path(ca_bundle).read_bytes(), ca_needles, tmp_path) == []


@pytest.fixture(scope="session")
def c31_bundle(base13, tmp_path_factory) -> dict:
    """Case C31: a host bundle holding Debian bookworm's roots, a public root that bookworm's ca-certificates
    lacks (one pip's certifi carries) and a private CA made here with openssl (an intercepting proxy's)."""
    out = _run(base13, "cat /etc/ssl/certs/ca-certificates.crt").stdout.encode()
    debian = {_der(c) for c in _PEM.findall(out)}
    certifi = _run(base13, "cat /opt/venv/lib/python3*/site-packages/pip/_vendor/certifi/cacert.pem").stdout.encode()
    newer = [c for c in _PEM.findall(certifi) if _der(c) not in debian]
    assert newer, "pip's certifi carries no root that bookworm lacks: C31 cannot be staged with this pip"
    d = tmp_path_factory.mktemp("c31")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=cudastack-test private proxy CA", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "private.pem")], check=True, capture_output=True)
    private = _PEM.findall((d / "private.pem").read_bytes())[0]
    bundle = out + newer[0] + b"\n" + private + b"\n"
    (d / "ca.crt").write_bytes(bundle)
    return {"path": d / "ca.crt", "bundle": bundle, "public": newer[0], "private": private, "debian": out}


@pytest.mark.docker
@pytest.mark.network
def test_c31_public_root_newer_than_bookworm_is_no_leak(runtime13, public_bundles, c31_bundle, tmp_path):
    """C31: the host's public root that bookworm lacks is in pip's certifi inside the image, which is no leak;
    only the private CA is looked for. (The check that compared with Debian's bundle alone flagged pip's
    vendored cacert.pem here.)"""
    needles = _ca_needles(c31_bundle["bundle"], public_bundles)
    assert needles == [c31_bundle["private"].splitlines()[len(c31_bundle["private"].splitlines()) // 2]]
    assert _ca_leaks(runtime13, c31_bundle["bundle"], needles, tmp_path) == []
    # the staging is real: compared with Debian's bundle alone (the old rule), pip's certifi is "a leak"
    debian_only = _ca_needles(c31_bundle["bundle"], c31_bundle["debian"])
    assert any("pip/_vendor/certifi/cacert.pem" in h
               for h in _ca_leaks(runtime13, c31_bundle["bundle"], debian_only, tmp_path))


@pytest.mark.docker
@pytest.mark.network
def test_ca_leak_check_finds_a_planted_bundle(os_image, ca_bundle, ca_needles, c31_bundle, public_bundles,
                                              tmp_path):
    """The leak check is not blind: an image that COPYs the host's bundle into a layer is caught, and so is
    the C31 bundle's private CA alone, appended to a copy of Debian's public bundle."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(ca_bundle, ctx / "ca.crt")
    (ctx / "mixed.pem").write_bytes(public_bundles[:200_000].rsplit(b"-----END CERTIFICATE-----", 1)[0]
                                    + b"-----END CERTIFICATE-----\n" + c31_bundle["private"] + b"\n")
    (ctx / "Dockerfile").write_text(f"FROM {os_image['tag']}\nCOPY ca.crt /usr/share/planted/ca.crt\n"
                                    "COPY mixed.pem /etc/planted/mixed.pem\n")
    tag = f"{TEST_REPO}/planted-ca:latest"
    _client().images.build(path=str(ctx), tag=tag, rm=True)
    try:
        hits = _ca_leaks(tag, Path(ca_bundle).read_bytes(), ca_needles, tmp_path)
        c31_needles = _ca_needles(c31_bundle["bundle"], public_bundles)
        c31_hits = _ca_leaks(tag, c31_bundle["bundle"], c31_needles, tmp_path)
    finally:
        _client().images.remove(tag, force=True)
    assert any("usr/share/planted/ca.crt" in h for h in hits), hits
    assert any("etc/planted/mixed.pem" in h for h in c31_hits), c31_hits


@pytest.mark.docker
@pytest.mark.network
def test_base_pip_refuses_empty_toolkit_specs(build, os_image, empty_ctx):
    from cudastack.core.errors import BuildError

    with pytest.raises(BuildError) as info:
        build("base-pip-empty", "base-pip", empty_ctx, tag=f"{TEST_REPO}/base-pip:broken", build_args={
            "OS_IMAGE": os_image["tag"], "CUDA_PIP_SPECS": "", "CUDA_VERSION": CUDA13_VERSION, "CUDA_WHEEL_ROOT": ""})
    assert "CUDA_PIP_SPECS is empty" in str(info.value)


@pytest.mark.docker
@pytest.mark.network
def test_base_pip_cuda12_layout_says_no_nvcc(build, os_image, empty_ctx):
    tag = f"{TEST_REPO}/base-pip:cu12.8"
    build("base-pip-cu12.8", "base-pip", empty_ctx, tag=tag, build_args={
        "OS_IMAGE": os_image["tag"], "CUDA_PIP_SPECS": CUDA12_SPECS, "CUDA_VERSION": "12.8.1", "CUDA_WHEEL_ROOT": ""})
    out = _run(tag, "cat $CUDA_HOME/NO_NVCC; command -v nvcc || echo nvcc-absent; ptxas --version | tail -1; "
                    "readlink -f $CUDA_HOME/lib64/libcudart.so; test -f $CUDA_HOME/include/thrust/version.h && echo thrust").stdout
    assert "carry no nvcc" in out and "nvcc-absent" in out
    assert "12.8" in out  # ptxas version line
    assert re.search(r"libcudart\.so\.12\b", out) and "thrust" in out


# --- image / base-nvidia ---------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.network
def test_image_node_installs_with_build_env(build, base13, empty_ctx):
    tag = f"{TEST_REPO}/image:six"
    build("image-six", "image", empty_ctx, tag=tag, build_args={
        "PARENT_IMAGE": base13, "PIP_SPECS": "six==1.17.0",
        "BUILD_ENV": "PIP_TARGET=/opt/test-target CUDASTACK_SPACED='12.0a 12.1a'"})
    out = _run(tag, "ls /opt/test-target; env | grep -c CUDASTACK_SPACED || true").stdout
    assert "six.py" in out.split()
    assert out.split()[-1] == "0", "BUILD_ENV must not leak into the image's environment"


@pytest.mark.docker
@pytest.mark.network
def test_base_nvidia_dockerfile_on_a_cuda_image(build, base13, empty_ctx):
    """nvidia/cuda images cannot be pulled here: build base-nvidia on our CUDA 13.1 image instead (same layout:
    CUDA at /usr/local/cuda, Debian-family apt), and check its CUDA version guard."""
    from cudastack.core.errors import BuildError

    tag = f"{TEST_REPO}/base-nvidia:on-pip"
    build("base-nvidia", "base-nvidia", empty_ctx, tag=tag,
          build_args={"BASE_IMAGE": base13, "CUDA_VERSION": CUDA13_VERSION})
    out = _run(tag, "command -v python pip nvcc with-build-ca; echo $CUDA_HOME $CPLUS_INCLUDE_PATH").stdout
    assert "/opt/venv/bin/python" in out and "/usr/local/cuda/bin/nvcc" in out and "with-build-ca" in out
    with pytest.raises(BuildError) as info:
        build("base-nvidia-mismatch", "base-nvidia", empty_ctx, tag=f"{TEST_REPO}/base-nvidia:broken",
              build_args={"BASE_IMAGE": base13, "CUDA_VERSION": "12.8.1"})
    assert "is not CUDA 12.8.1" in str(info.value)


# --- wheels + runtime with the cuda_ext fixture -----------------------------------------------------
@pytest.mark.docker
@pytest.mark.network
def test_fixture_wheel_export_holds_only_wheels(fixture_wheelhouse):
    files = sorted(p.name for p in fixture_wheelhouse.iterdir())
    assert len(files) == 1 and re.fullmatch(r"cuda_ext_fixture-0\.1\.0-cp3\d+-cp3\d+-linux_x86_64\.whl", files[0]), files
    import zipfile

    names = zipfile.ZipFile(fixture_wheelhouse / files[0]).namelist()
    assert any(re.fullmatch(r"cuda_ext_fixture/_cuda_ext.*\.so", n) for n in names), names


@pytest.mark.docker
@pytest.mark.network
def test_wheels_builder_installs_build_deps_and_validates_method(build, base13, tmp_path):
    from cudastack.core.errors import BuildError

    (tmp_path / "empty").mkdir()
    # a pure-Python source tree whose setup.py imports a build-time dependency: builds only with BUILD_DEPS
    src = tmp_path / "ctx" / "needs_six"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("import six\nfrom setuptools import setup\n"
                                  "setup(name='needs-six', version='0.1', py_modules=['needs_six'])\n")
    (src / "needs_six.py").write_text("X = 1\n")
    out_dir = tmp_path / "wh"
    build("wheels-build-deps", "wheels", tmp_path / "ctx", target="wheels", output_dir=str(out_dir), build_args={
        "PARENT_IMAGE": base13, "METHOD": "source", "SOURCE_DIR": "needs_six", "BUILD_DEPS": "six==1.17.0"})
    assert [p.name for p in out_dir.iterdir()] == ["needs_six-0.1-py3-none-any.whl"]
    with pytest.raises(BuildError) as info:
        build("wheels-bad-method", "wheels", tmp_path / "empty", target="wheels", output_dir=str(tmp_path / "out"),
              build_args={"PARENT_IMAGE": base13, "METHOD": "sdist", "PIP_SPECS": "six==1.17.0"})
    assert "METHOD must be 'wheel' or 'source'" in str(info.value)
    bad_out = tmp_path / "out"
    assert not bad_out.exists() or not any(bad_out.iterdir()), "a failed build must export nothing"


@pytest.mark.docker
@pytest.mark.network
def test_runtime_image_imports_fixture_without_gpu_and_has_sm120_sass(runtime13, ca_bundle, tmp_path):
    script = (
        "set -e; cd /; "
        "python -c 'import cuda_ext_fixture as c, stackprobe, elftools; "
        "print(\"sum\", c.host_sum([1, 2, 3, 4])); print(\"archs\", *c.compiled_archs()); print(\"lib\", c.LIB_PATH)'; "
        "echo FI=${FLASHINFER_CUDA_ARCH_LIST:-unset} TORCH=${TORCH_CUDA_ARCH_LIST-unset}; "
        "python -m stackprobe --help >/dev/null && echo stackprobe-cli-ok; "
        # test-only: cuobjdump from PyPI (13.1's wheel set has none), into /tmp of this throwaway container
        f"with-build-ca pip install -q --no-compile --target /tmp/cuobjdump '{CUOBJDUMP_SPEC}'; "
        "lib=$(python -c 'import cuda_ext_fixture as c; print(c.LIB_PATH)'); "
        "/tmp/cuobjdump/nvidia/cu13/bin/cuobjdump --list-elf \"$lib\""
    )
    volumes = {ca_bundle: "/run/secrets/cabundle:ro"} if ca_bundle else {}
    out = _run(runtime13, script, volumes=volumes).stdout
    assert "sum 10" in out and "archs 120" in out, out
    assert "FI=12.0f" in out and "TORCH=unset" in out, out
    assert "stackprobe-cli-ok" in out, out
    elves = re.findall(r"\bsm_\d+[af]?\b", out.split("lib ", 1)[1])
    assert elves and set(elves) == {"sm_120"}, out
