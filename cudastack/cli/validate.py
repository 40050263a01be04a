"""Invoke tasks (validate). Thin: parse flags, call the package, map StackError to its exit code."""
from __future__ import annotations

import sys

from invoke import Exit, task

from cudastack.core.errors import StackError, UsageError

#: where reports go unless --out names a folder: inside .stack/, which .gitignore covers
DEFAULT_OUT = ".stack/validate"

_HELP = {
    "image": "Image to validate (repeatable; tag or digest). Two or more print what changed between them per "
             "backend, and why. Without --image the current environment is validated.",
    "target_arch": "Target compute capability (default 12.0: RTX PRO 6000 Blackwell / RTX 50xx).",
    "out": "Folder for the JSON reports (one per image). Default: .stack/validate (git-ignored); name a folder "
           "under results/ to publish them.",
    "order": "Column order of a comparison: toolchain (default: older to newer CUDA toolchain, so it reads "
             "before -> after) or given (the order of --image).",
    "markdown": "Also write the printed Markdown (matrix or comparison) to this file.",
    "jit_compile": "Also compile FlashInfer's allreduce-fusion module for the target (minutes; cached by content).",
    "world_size": "Tensor-parallel size the verdicts are for (default 8).",
    "topology": "GPU interconnect of the target host: auto (detected with GPUs, else PCIe), pcie or nvlink.",
    "image_suite": "Run the suite copy the image carries instead of this checkout's (reports name its digest either way).",
    "env": "K=V set in the image's container (repeatable), e.g. --env CUDA_HOME=/nonexistent --env "
           "PATH=/opt/venv/bin:/usr/bin:/bin to validate as a host with no nvcc would run the image; also the SGLang "
           "server's environment the verdicts are for (e.g. --env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1).",
    "server_args": "The SGLang server flags the verdicts are for, one quoted string (default: none), e.g. "
                   "--server-args \"--enable-symm-mem\"; checked against the installed SGLang's own flags.",
    "hide": "Folder of the image covered with an empty read-only one in the validation container (repeatable), "
            "e.g. --hide /usr/local/cuda/bin --hide /opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin to run "
            "the suite with no nvcc at all; the image itself is not changed.",
    "engine": "The serving engine whose answers the reports give: sglang, vllm or auto (default: whichever is installed "
              "in the image, both when both are).",
    "strict": "Exit 10 (after writing the reports) when any report's environment health stage found an error (for CI).",
}


@task(help=_HELP, iterable=["image", "env", "hide"], auto_shortflags=False)
def validate(c, image=None, target_arch="12.0", out=DEFAULT_OUT, markdown=None, jit_compile=False,
             world_size=8, topology="auto", image_suite=False, order="toolchain", env=None,
             hide=None, server_args="", strict=False, engine="auto"):
    """Validate images (or this environment): which allreduce backends can work for the target arch, and why."""
    from cudastack.jobs.validate import validate_many

    try:
        try:
            ws = int(world_size)
        except (TypeError, ValueError):
            raise UsageError(f"--world-size {world_size!r}: give a whole number of GPUs.") from None
        if topology not in ("auto", "pcie", "nvlink"):
            raise UsageError(f"--topology {topology!r}: use auto, pcie or nvlink.")
        from stackprobe.engines import CHOICES
        if engine not in CHOICES:
            raise UsageError(f"--engine {engine!r}: use one of {', '.join(CHOICES)} (auto: whichever serving engine is "
                             "installed, both when both are).")
        extra_env = {}
        for item in env or []:
            k, sep, v = str(item).partition("=")
            if not sep or not k or not k.replace("_", "").isalnum():
                raise UsageError(f"--env {item!r}: write NAME=VALUE, e.g. --env CUDA_HOME=/nonexistent.")
            extra_env[k] = v
        from cudastack.jobs.validate import check_hidden
        hidden = check_hidden(hide)
        if hidden and not image:
            raise UsageError("--hide applies to --image runs (it covers folders of the image in its container).")
        reports, text = validate_many(list(image or []), str(target_arch), out_dir=out, order=str(order),
                                jit_compile=bool(jit_compile),
                                world_size=ws, topology=topology, say=lambda m: print(m, file=sys.stderr),
                                **({"image_suite": True} if image_suite else {}),
                                **({"extra_env": extra_env} if extra_env and image else {}),
                                **({"server_env": extra_env} if extra_env else {}),
                                **({"server_args": str(server_args)} if server_args else {}),
                                **({"engine": str(engine)} if engine != "auto" else {}),
                                **({"hide": hidden} if hidden else {}))
    except StackError as exc:
        raise Exit(f"error: {exc}", code=exc.exit_code)
    print(text)
    if markdown:
        from stackprobe.atomic import write_atomic
        write_atomic(markdown, text)
    if strict:
        _strict(reports)


def _strict(reports) -> None:
    """``--strict``: exit :class:`UnhealthyEnvironment`'s code naming the first error of each unhealthy report."""
    from cudastack.core.errors import UnhealthyEnvironment
    from stackprobe.health_stage import errors

    bad = [(r.label or "this environment", errs) for r in reports if (errs := errors(r.environment.get("health")))]
    if bad:
        exc = UnhealthyEnvironment("; ".join(f"{label}: {len(e)} environment health error(s), first: {e[0]['message']}"
                                             for label, e in bad))
        raise Exit(f"error: {exc}", code=exc.exit_code)


TASKS = [validate]
