"""Invoke tasks (upgrade radar): outdated, scan. Thin: parse flags, call cudastack.jobs.radar."""
from __future__ import annotations

from cudastack.cli.common import stack_task
from cudastack.jobs import radar as jobs

_HELP = {
    "cuda": "Toolchain as named in recipes/toolchains.yaml (e.g. 13.2). Default: every toolchain.",
    "index": "PEP 691 simple index URL (default https://pypi.org/simple, or $CUDASTACK_INDEX).",
    "refresh": "Ask the index again for every project page (pages are otherwise reused for an hour).",
    "recipes": "Recipes folder (toolchains.yaml + one file per component). Default: the project's recipes/.",
    "arch": "Target compute capability (default 12.0).",
    "world_size": "Tensor-parallel size the engine gates are read for (default 8).",
    "topology": "GPU interconnect the engine gates are read for: pcie (default) or nvlink.",
    "out": "Folder for the Markdown tables (cu<X>.md) and radar.json. Default: .stack/radar in the project root (ignored by git).",
    "no_verdicts": "Skip reading newer releases as sites (no lay-outs, no tier runs; the last column says 'not read').",
    "package": "Package to scan, as the index names it (flashinfer-python, sglang, sglang-kernel, ...).",
    "versions": "Releases to scan: A..B (inclusive), A.., ..B or one version. Default: every release.",
    "all": "Scan every release in range (no bisection) and print each one's gates.",
    "python": "Python the picked wheel must install on (default 3.11, the pip base's).",
    "pre": "Include pre-releases.",
    "json": "Write the result as JSON to FILE, or to standard output with - (then alone there: the human lines go to standard error).",
}


@stack_task(root_defaults=["out"], choices={"topology": ("pcie", "nvlink")},
            help={k: _HELP[k] for k in ("cuda", "index", "refresh", "recipes", "arch", "world_size", "topology",
                                  "out", "no_verdicts", "json")}, auto_shortflags=False)
def outdated(c, cuda=None, index=None, refresh=False, recipes=None, arch="12.0", world_size=8, topology="pcie",
             out=".stack/radar", no_verdicts=False, json=None):
    """Per component: pinned, newest and newest allowed release, and what holds each back.

    Per toolchain and component: pinned, newest, newest the engine's pins allow, what holds it back, and
    what a move would change in the static verdicts. Writes one Markdown table per toolchain to --out."""
    return jobs.outdated(cuda=cuda, index=index, refresh=refresh, recipes=recipes, target_arch=arch,
                         world_size=world_size, topology=topology, out=out, no_verdicts=no_verdicts,
                         json_out=json)


@stack_task(choices={"topology": ("pcie", "nvlink")},
            help={k: _HELP[k] for k in ("package", "versions", "arch", "world_size", "topology", "index", "refresh",
                                  "all", "python", "pre", "json")}, auto_shortflags=False)
def scan(c, package=None, versions=None, arch="12.0", world_size=8, topology="pcie", index=None, refresh=False,
         all=False, python="3.11", pre=False, json=None):  # noqa: A002 - the flag is --all
    """Scan a package's releases and print the first release that lifts each static gate.

    Downloads releases (no install), reads the suite's static gates and arch coverage from each release's own
    files, and bisects over the releases for the first one that lifts each gate."""
    return jobs.scan(package=package, versions=versions, target_arch=arch, world_size=world_size,
                     topology=topology, index=index, refresh=refresh, all=all, python=python, pre=pre,
                     json_out=json)


TASKS = [outdated, scan]
