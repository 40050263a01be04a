"""Static reports of SGLang's answers read from the pinned PyPI wheels, with this checkout's suite, where no stack image
is at hand: each engine release and the FlashInfer it pins are installed without dependencies into a folder of their
own, and ``python -m stackprobe`` (this checkout's ``validate/``) reads them from this project's virtual environment
(torch there is a CPU build: the health section says the stack is not the image's). The engine rows are read from
the engine's own source, file and line cited, exactly as in an image; the library rows read the wheels as PyPI ships
them (no ahead-of-time FlashInfer modules, no nvcc on PATH).

Usage: ``python scripts/venv_reports.py [OUT]`` (default ``results/validate-sglang-venv``). Writes
``<label>.json`` and ``<label>.md`` per configuration, then the comparison and its figure (``render_results``).
Needs PyPI (``pip download``); the wheels are kept under ``$CUDASTACK_VENV_REPORTS`` (default
``~/.cache/cudastack/venv-reports``). Exit 1 with the suite's own error when a run fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CUDASTACK_VENV_REPORTS", Path.home() / ".cache" / "cudastack" / "venv-reports"))
#: label -> (wheels, extra suite arguments), older first (the comparison keeps the files' order); the pins are the images' (recipes/sglang.yaml, recipes/flashinfer.yaml)
CONFIGS = {
    "1-sglang-0.5.9": (["sglang==0.5.9", "flashinfer-python==0.6.3"], []),
    "2-sglang-0.5.23": (["sglang==0.5.23", "flashinfer-python==0.7.2"], []),
    "3-sglang-0.5.23-pcie-ipc": (["sglang==0.5.23", "flashinfer-python==0.7.2"],
                               ["--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]),
}
#: what each report calls itself (its title and comparison column): the reading, not an image
LABEL = "{stem} (pinned wheels in a CPU venv, no image)"
COMMON = ["--engine", "sglang", "--arch", "12.0", "--topology", "pcie", "--world-size", "8", "--quiet"]


def target(spec: str) -> Path:
    """``pip install --no-deps --target`` of one wheel, once (the folder is the cache key)."""
    d = CACHE / spec.replace("==", "-")
    if not (d / ".done").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", str(d), spec], check=True)
        (d / ".done").write_text(spec + "\n")
    return d


def run(label: str, specs: list[str], extra: list[str], out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FLASHINFER_", "NCCL_", "SGLANG_",
                                                                      "VLLM_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "validate")] + [str(target(s)) for s in specs])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    cmd = [sys.executable, "-m", "stackprobe", *COMMON, "--label", LABEL.format(stem=label.split("-", 1)[1]), *extra,
           "--json", str(out / f"{label}.json"), "--markdown", str(out / f"{label}.md")]
    print(f"[venv-reports] {label}: {' '.join(specs)} {' '.join(extra)}", flush=True)
    p = subprocess.run(cmd, env=env, cwd=ROOT)
    if p.returncode not in (0,):
        sys.exit(f"{label}: python -m stackprobe exited {p.returncode}")


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else ROOT / "results" / "validate-sglang-venv"
    out.mkdir(parents=True, exist_ok=True)
    for label, (specs, extra) in CONFIGS.items():
        run(label, specs, extra, out)
    # the comparison and its figure, as the docstring says (it was left stale before: a comparison of an older suite)
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for f in mod.render(out):
        print(f"[venv-reports] wrote {f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
