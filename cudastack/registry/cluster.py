"""Cluster jobs that run the validation suite from a pinned image on GPU nodes and keep its JSON reports.

* Slurm + pyxis/enroot: a batch script whose ``srun --container-image=REGISTRY#NAME@sha256:...`` (pyxis's
  flag; enroot's image URI puts ``#`` between registry and name) runs ``python -m stackprobe --json ...``
  once per node (``--ntasks-per-node=1``), with the reports folder bind-mounted (``--container-mounts``).
  Sources: pyxis README (``--container-image``, ``--container-mounts``, ``--container-workdir``,
  ``--no-container-mount-home``); enroot ``doc/cmd/import.md`` (image URIs); sbatch(1) (``--gpus-per-node``).
  Before importing, the job runs ``enroot version`` on every node and stops below :data:`ENROOT_MIN`
  (4.0.0, the first enroot release whose ``docker::_parse_uri`` accepts a digest reference
  ``REGISTRY#IMAGE@sha256:...``; enroot 3.x reads the digest as part of a tag and the import fails; enroot
  v4.0.0 release notes) (case C30).
* A loopback registry (127.0.0.0/8, ::1, localhost) is the submit host's own: compute nodes reach their own
  loopback, not it. :func:`loopback_problem` says so; the builders refuse it with ``loopback="refuse"`` and
  otherwise write a warning into the job (the Slurm script then refuses to start unless
  ``STACKPROBE_ALLOW_LOOPBACK=1``, for a one-node cluster that serves the registry itself).
* Kubernetes: a ``batch/v1`` Job, one pod per node (``completions`` = ``parallelism`` = nodes, Indexed
  completion mode, a required pod anti-affinity on ``kubernetes.io/hostname`` so no two pods share a node),
  requesting ``nvidia.com/gpu: N`` (the NVIDIA device plugin's resource name), the image by digest, a
  memory-backed ``/dev/shm`` (NCCL needs more than the 64 MiB default), the report written to a volume
  (a ``hostPath`` folder on the node, or an ``emptyDir``) and also printed to the pod log between markers so
  ``kubectl logs`` alone recovers it (:func:`reports_from_log`).
  Sources: Kubernetes API reference for Job (batch/v1), PodSpec, Volume (hostPath ``DirectoryOrCreate``,
  emptyDir ``medium: Memory``), downward API ``fieldRef: spec.nodeName``.

Both are pure text/dict builders; :func:`write_job` writes them atomically. Nothing here contacts a cluster.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Iterable, Optional

import yaml

from cudastack.core.errors import EnvironmentError_, UsageError
from stackprobe.api import write_atomic
from cudastack.registry.reference import parse_reference

REPORT_BEGIN = "----- BEGIN STACKPROBE REPORT"
REPORT_END = "----- END STACKPROBE REPORT"
DEFAULT_MOUNT = "/reports"
ENROOT_MIN = "4.0.0"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _pinned(image: str):
    ref = parse_reference(image)
    if not ref.digest:
        raise UsageError(
            f"The cluster image {image!r} has no digest; a cluster must run exactly what was validated. Push it "
            "first (invoke push) and use the recorded registry/name@sha256:... reference."
        )
    return ref


def loopback_problem(ref) -> Optional[str]:
    """A one-paragraph warning when ``ref`` (a parsed reference) names a loopback registry, else None."""
    from cudastack.registry.reference import is_loopback

    if not ref.registry or not is_loopback(ref.registry):
        return None
    return (f"The image's registry {ref.registry} is a loopback address: on a compute node it names that node "
            "itself, not the machine that pushed the image, so the import fails there. Push the runtime to a "
            "registry the nodes can reach (invoke push --cuda <version> --registry HOST:PORT/NAMESPACE) and "
            "pass its reference (or relock the push), or run the job on the one node that serves this registry.")


def _check_loopback(ref, loopback: str) -> Optional[str]:
    if loopback not in ("warn", "refuse"):
        raise UsageError(f"loopback={loopback!r}: use 'warn' or 'refuse'.")
    problem = loopback_problem(ref)
    if problem and loopback == "refuse":
        raise UsageError(problem)
    return problem


def enroot_check_lines(minimum: str = ENROOT_MIN) -> list[str]:
    """Bash lines that run ``enroot version`` on every node of the allocation (one task per node) and stop
    the job with a clear message where it is missing or older than ``minimum`` (``sort -V`` ordering)."""
    msg = (f"enroot $v on $(hostname) is older than {minimum}, the first release that parses "
           "REGISTRY#IMAGE@sha256:... (digest) image references; upgrade enroot (and pyxis) on the compute nodes")
    check = (f'v=$(enroot version 2>/dev/null) || {{ echo "enroot is not installed on $(hostname): pyxis needs it" >&2; exit 3; }}; '
             f'if [ "$(printf "%s\n%s\n" {minimum} "$v" | sort -V | head -n1)" != {minimum} ]; then '
             f'echo "{msg}" >&2; exit 3; fi; echo "enroot $v on $(hostname)"')
    return [
        f"# enroot >= {minimum} on every node: older enroot rejects the digest reference below (case C30).",
        "# shellcheck disable=SC2016",
        f"srun --ntasks-per-node=1 bash -c {shlex.quote(check)}",
        "",
    ]


def _check_counts(gpus: int, nodes: int) -> None:
    if not isinstance(gpus, int) or gpus < 1:
        raise UsageError(f"--gpus {gpus!r}: give the number of GPUs per node, at least 1.")
    if not isinstance(nodes, int) or nodes < 1:
        raise UsageError(f"--nodes {nodes!r}: give the number of nodes, at least 1.")


def probe_command(report_path: str, probe_args: Iterable[str] = ()) -> list[str]:
    """``python -m stackprobe --json REPORT [ARGS...]``: the suite's command line inside the image."""
    return ["python", "-m", "stackprobe", "--json", report_path, *probe_args]


def p2p_check_command() -> str:
    """The job's first step on each node, before the suite: ``python -m stackprobe.runtime p2p`` (per GPU pair a peer
    copy and a kernel-side peer read/write in a child with a timeout, checked against known data), its pages written
    beside the report (``<report>-p2p/``). Its exit status does not stop the suite: the runtime tier reads the same
    check before any peer-memory path, and the report's host section says what the box shows."""
    return 'python -m stackprobe.runtime p2p --out "${REPORT%.json}-p2p" || echo "stackprobe: the P2P check found a problem (see ${REPORT%.json}-p2p)" >&2'


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def server_config_args(server_args: str = "", env: Iterable[str] = ()) -> list[str]:
    """The SGLang server configuration a job validates for, as ``python -m stackprobe`` arguments:
    ``--server-args=FLAGS`` (glued: a value starting with ``--`` would read as a flag) and ``--env NAME=VALUE``
    per item. The suite in the image applies them to its static answer and hands them to the runtime tier it
    runs on the node (stackprobe ``__main__``: ``--server-args``, ``--env``). Raises UsageError for an
    unquotable ``server_args`` or an ``env`` item that is not ``NAME=VALUE`` with a shell variable name."""
    out: list[str] = []
    if server_args:
        try:
            shlex.split(server_args)
        except ValueError as exc:
            raise UsageError(f"--server-args {server_args!r} is not one shell-quoted string of SGLang flags ({exc}); "
                             "write it as you would after `python -m sglang.launch_server`, e.g. "
                             "--server-args \"--enable-symm-mem --tp 8\".") from None
        out.append(f"--server-args={server_args}")
    for item in env or ():
        k, sep, _ = str(item).partition("=")
        if not sep or not _ENV_NAME.match(k):
            raise UsageError(f"--env {item!r}: write NAME=VALUE with a shell variable name, e.g. "
                             "--env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1.")
        out += ["--env", str(item)]
    return out


def job_name(toolchain: str, digest: str) -> str:
    """A DNS-1123 label naming the job: ``stackprobe-cu13-1-<12 hex of the digest>``."""
    name = f"stackprobe-cu{toolchain.replace('.', '-')}-{digest.split(':', 1)[-1][:12]}".lower()
    name = re.sub(r"[^a-z0-9-]", "-", name)[:63].strip("-")
    return name


# ----------------------------------------------------------------------------------------------- Slurm
def slurm_script(image: str, *, gpus: int, nodes: int = 1, toolchain: str = "", name: Optional[str] = None,
                 partition: Optional[str] = None, account: Optional[str] = None, time_limit: str = "01:00:00",
                 report_dir: Optional[str] = None, probe_args: Iterable[str] = (),
                 container_mount: str = DEFAULT_MOUNT, loopback: str = "warn", server_args: str = "",
                 env: Iterable[str] = ()) -> str:
    """An sbatch script (bash) running the suite from ``image`` (``registry/name@sha256:...`` or the enroot
    spelling) on ``nodes`` nodes with ``gpus`` GPUs each. Reports land in ``report_dir`` (default: the
    submit folder's ``stackprobe-reports/``; override at submit time with ``STACKPROBE_REPORT_DIR``), one
    ``stackprobe-<jobid>-<host>.json`` per node. The job first checks enroot >= :data:`ENROOT_MIN` on every
    node (:func:`enroot_check_lines`). ``loopback``: "warn" (a loopback registry makes the script refuse to
    start unless ``STACKPROBE_ALLOW_LOOPBACK=1``) or "refuse" (UsageError now). ``server_args`` / ``env``: the
    SGLang server configuration the node's run answers for (:func:`server_config_args`). Raises UsageError (no
    digest, bad counts, bad time, a refused loopback registry, a bad server configuration)."""
    ref = _pinned(image)
    probe_args = [*probe_args, *server_config_args(server_args, env)]
    _check_counts(gpus, nodes)
    problem = _check_loopback(ref, loopback)
    if not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){0,2}", time_limit):
        raise UsageError(f"--time {time_limit!r}: use Slurm's [D-]HH:MM:SS form, e.g. 01:00:00.")
    name = name or job_name(toolchain or "x", ref.digest)
    default_dir = report_dir or "${SLURM_SUBMIT_DIR:-$PWD}/stackprobe-reports"
    report = f"{container_mount}/stackprobe-${{SLURM_JOB_ID:-0}}-${{SLURMD_NODENAME:-$(cat /proc/sys/kernel/hostname)}}.json"
    cmd = " ".join(shlex.quote(a) for a in probe_command("REPORT", probe_args)).replace("REPORT", '"$REPORT"', 1)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={name}-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += [
        "#",
        f"# Generated by cudastack: the validation suite (stackprobe) for CUDA {toolchain or '?'} on {nodes} node(s)",
        f"# x {gpus} GPU(s), from the image pinned by digest (pyxis/enroot). Submit with: sbatch <this file>",
        f"# Image (docker spelling): {ref.pinned()}",
        "set -euo pipefail",
        "",
        f"IMAGE={shlex.quote(ref.enroot())}",
        f'REPORT_DIR="${{STACKPROBE_REPORT_DIR:-{default_dir}}}"',
        "",
    ]
    if problem:
        lines += [f"# WARNING: {line}" for line in _wrap(problem)] + [
            'if [ "${STACKPROBE_ALLOW_LOOPBACK:-0}" != 1 ]; then',
            f"  echo {shlex.quote(problem + ' (Set STACKPROBE_ALLOW_LOOPBACK=1 to run anyway.)')} >&2",
            "  exit 2",
            "fi",
            "",
        ]
    lines += enroot_check_lines() + [
        'mkdir -p "$REPORT_DIR"',
        "",
        "# One task per node; each writes its own JSON report into the bind-mounted folder. The inner command",
        "# is single-quoted on purpose: its variables expand inside the container, on each node.",
        "# shellcheck disable=SC2016",
        f'srun --ntasks-per-node=1 --container-image="$IMAGE" --container-mounts="$REPORT_DIR:{container_mount}" \\',
        f"     --container-workdir={container_mount} --no-container-mount-home \\",
        f"     bash -c {shlex.quote(f'REPORT={report}; {p2p_check_command()}; exec {cmd}')}",
        "",
        'echo "stackprobe reports in $REPORT_DIR:"',
        'ls -l "$REPORT_DIR"',
        "",
    ]
    return "\n".join(lines)


def _wrap(text: str, width: int = 100) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width)


# ----------------------------------------------------------------------------------------- Kubernetes
def kubernetes_job(image: str, *, gpus: int, nodes: int = 1, toolchain: str = "", name: Optional[str] = None,
                   namespace: str = "default", host_path: Optional[str] = None,
                   node_selector: Optional[dict] = None, image_pull_secret: Optional[str] = None,
                   probe_args: Iterable[str] = (), shm_size: str = "16Gi", ttl_seconds: int = 7 * 24 * 3600,
                   active_deadline_seconds: int = 3600, container_mount: str = DEFAULT_MOUNT,
                   loopback: str = "warn", server_args: str = "", env: Iterable[str] = ()) -> dict:
    """A ``batch/v1`` Job (a dict) running the suite from ``image`` (must carry a digest) on ``nodes`` distinct
    nodes with ``gpus`` GPUs each. ``host_path``: keep reports in this folder on each node (hostPath,
    DirectoryOrCreate); without it they go to an emptyDir and survive only in the pod log (between
    :data:`REPORT_BEGIN`/:data:`REPORT_END`). ``image_pull_secret``: name of a Secret of type
    dockerconfigjson (credentials stay in the cluster, never in the manifest). ``loopback``: "warn" (the
    warning goes into the annotation ``cudastack/warning``) or "refuse". ``server_args`` / ``env``: as for
    :func:`slurm_script`. Raises UsageError."""
    ref = _pinned(image)
    probe_args = [*probe_args, *server_config_args(server_args, env)]
    _check_counts(gpus, nodes)
    problem = _check_loopback(ref, loopback)
    name = name or job_name(toolchain or "x", ref.digest)
    for label, value in (("name", name), ("namespace", namespace)):
        if not _DNS_LABEL.match(value) or len(value) > 63:
            raise UsageError(f"Kubernetes {label} {value!r} is not a DNS-1123 label (lowercase letters, digits, '-').")
    if host_path is not None and not host_path.startswith("/"):
        raise UsageError(f"--host-path {host_path!r} must be an absolute folder on the node.")
    labels = {"app.kubernetes.io/name": "stackprobe", "app.kubernetes.io/managed-by": "cudastack",
              "cudastack/toolchain": re.sub(r"[^A-Za-z0-9._-]", "-", toolchain or "unknown")}
    report = f"{container_mount}/stackprobe-$NODE_NAME-$JOB_COMPLETION_INDEX.json"
    cmd = " ".join(shlex.quote(a) for a in probe_command("REPORT", probe_args)).replace("REPORT", '"$REPORT"', 1)
    script = "\n".join([
        f'REPORT="{report}"',
        p2p_check_command(),
        f"{cmd}",
        "rc=$?",
        f'echo "{REPORT_BEGIN} $NODE_NAME -----"',
        'cat "$REPORT" 2>/dev/null || echo "{}"',
        f'echo "{REPORT_END} -----"',
        "exit $rc",
    ])
    pod_spec: dict = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{
            "name": "stackprobe",
            "image": ref.pinned(),
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c"],
            "args": [script],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "PYTHONUNBUFFERED", "value": "1"}],
            "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
            "volumeMounts": [{"name": "reports", "mountPath": container_mount},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [
            {"name": "reports", **({"hostPath": {"path": host_path, "type": "DirectoryOrCreate"}} if host_path
                                   else {"emptyDir": {}})},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
        ],
    }
    if nodes > 1:
        pod_spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"job-name": name}}, "topologyKey": "kubernetes.io/hostname"}]}}
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if image_pull_secret:
        pod_spec["imagePullSecrets"] = [{"name": image_pull_secret}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": {"cudastack/image-enroot": ref.enroot(),
                                     **({"cudastack/warning": problem} if problem else {})}},
        "spec": {
            "completions": nodes,
            "parallelism": nodes,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "activeDeadlineSeconds": active_deadline_seconds,
            "ttlSecondsAfterFinished": ttl_seconds,
            "template": {"metadata": {"labels": {**labels, "job-name": name}}, "spec": pod_spec},
        },
    }


def require_kubernetes_validator() -> None:
    """Raise EnvironmentError_ (exit 5), in one paragraph, when ``kubernetes-validate`` (the ``kubernetes``
    extra of this project) cannot be imported: ``--scheduler kubernetes`` checks every Job against the
    Kubernetes schema before writing it, and refuses to write an unchecked one."""
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError as exc:
        import sys

        raise EnvironmentError_(
            f"`cluster-job --scheduler kubernetes` checks the Job against the Kubernetes schema with "
            f"kubernetes-validate, which this Python ({sys.executable}) cannot import ({exc}). Install the "
            "project's kubernetes extra (pip install -e '.[kubernetes]', or pip install 'kubernetes-validate>=1.28'), "
            "or write a Slurm script with --scheduler slurm.") from None


def validate_kubernetes(manifest: dict, version: Optional[str] = None) -> str:
    """Validate ``manifest`` against the Kubernetes OpenAPI schema bundled with ``kubernetes-validate``
    (strict: unknown fields are errors), offline. Returns the schema version used. Raises UsageError with
    the validator's message, EnvironmentError_ when the validator is not installed."""
    require_kubernetes_validator()
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    try:
        return kubernetes_validate.validate(manifest, version or latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise UsageError(f"The generated Kubernetes manifest does not validate: {exc}") from None


def reports_from_log(log: str) -> dict[str, dict]:
    """The JSON reports a Job printed to its log (``kubectl logs job/NAME``), keyed by node name."""
    out = {}
    for m in re.finditer(re.escape(REPORT_BEGIN) + r" (\S*) -----\n(.*?)\n" + re.escape(REPORT_END), log, re.S):
        out[m.group(1)] = json.loads(m.group(2))
    return out


def render_manifest(manifest: dict) -> str:
    return "# Generated by cudastack: kubectl apply -f <this file>; kubectl logs job/" + \
        manifest["metadata"]["name"] + "\n" + yaml.safe_dump(manifest, sort_keys=False, width=200)


def write_job(path: str, text: str) -> None:
    """Write a job file atomically (temp file, fsync, rename)."""
    write_atomic(path, text)
