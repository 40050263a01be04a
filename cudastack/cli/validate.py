"""Invoke task (validate). Thin: parse flags, call cudastack.jobs.validate."""
from __future__ import annotations

from cudastack.cli.common import stack_task
from cudastack.jobs import validate as jobs
from cudastack.jobs.validate import DEFAULT_OUT
from stackprobe.api import engine_choices

ENGINES = engine_choices()    # the --engine values when the task is defined


_HELP = {
    "json": "Write the result as JSON to FILE, or to standard output with - (then alone there: the human lines go to "
            "standard error).",
    "image": "Image to validate (repeatable; tag or digest). Two or more print what changed between them per "
             "backend, and why. Without --image the current environment is validated.",
    "arch": "Target compute capability (default 12.0: RTX PRO 6000 Blackwell / RTX 50xx).",
    "out": "Folder for the JSON reports (one per image). Default: .stack/validate in the project root (git-ignored); name a folder "
           "under results/ to publish them.",
    "order": "Column order of a comparison: toolchain (default: older to newer CUDA toolchain, so it reads "
             "before -> after) or given (the order of --image).",
    "markdown": "Also write the printed Markdown (matrix or comparison) to this file.",
    "jit_compile": "Also compile FlashInfer's allreduce-fusion module for the target (minutes; cached by content).",
    "world_size": "Tensor-parallel size the verdicts are for (default 8).",
    "topology": "GPU interconnect of the target host: auto (detected with GPUs, else PCIe), pcie or nvlink.",
    "image_suite": "Run the suite copy the image carries instead of this checkout's (reports name its digest either way).",
    "env": "K=V set in the image's container (repeatable), e.g. --env CUDA_HOME=/nonexistent --env "
           "PATH=/opt/venv/bin:/usr/bin:/bin to validate as a host with no nvcc would run the image; also the serving "
           "engine's environment the verdicts are for (e.g. --env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, or vLLM's "
           "--env VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1).",
    "server_args": "The serving engine's flags the verdicts are for, one quoted string (default: none), e.g. "
                   "--server-args \"--enable-symm-mem\" (SGLang) or \"--data-parallel-size 2\" (vLLM); checked "
                   "against the installed engine's own flags.",
    "hide": "Folder of the image covered with an empty read-only one in the validation container (repeatable), "
            "e.g. --hide /usr/local/cuda/bin --hide /opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin to run "
            "the suite with no nvcc at all; the image itself is not changed.",
    "engine": "The serving engine whose answers the reports give: sglang, vllm or auto (default: whichever is installed "
              "in the image, both when both are).",
    "strict": "Exit 10 (after writing the reports) when any report's environment health stage found an error (for CI).",
}


@stack_task(root_defaults=["out"], choices={"topology": ("auto", "pcie", "nvlink"), "order": ("toolchain", "given"), "engine": ENGINES},
            help=_HELP, iterable=["image", "env", "hide"], auto_shortflags=False)
def validate(c, image=None, arch="12.0", out=DEFAULT_OUT, markdown=None, jit_compile=False,
             world_size=8, topology="auto", image_suite=False, order="toolchain", env=None,
             hide=None, server_args="", strict=False, engine="auto", json=None):
    """Validate images (or this environment): which allreduce backends can work for the target arch, and why."""
    return jobs.validate(image=image, target_arch=arch, out=out, markdown=markdown, jit_compile=jit_compile,
                         world_size=world_size, topology=topology, image_suite=image_suite, order=order, env=env,
                         hide=hide, server_args=server_args, strict=strict, engine=engine, json_out=json)


TASKS = [validate]
