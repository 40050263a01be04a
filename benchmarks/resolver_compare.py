"""Benchmark (prints figures; not a test): the lock's two resolvers, pip's and uv's, on the real plans.

For each toolchain asked for (default 12.8 and 13.1, with the base and skipped components their committed
lockfiles name), every pip install of every plan node (``lock.node_installs``: the base's CUDA wheels and
venv tools, torch, the wheel nodes' ``--no-deps`` fetches, the runtime's SGLang and the suite's one
dependency) is resolved for the images' target (``lock.target_for_plan``: CPython 3.11, manylinux of the
image's glibc) on the same inputs, against the real index:

* **pip**: ``cudastack.lock.pip_resolve`` as ``invoke lock`` runs it (``pip install --dry-run --report``
  with ``--no-cache-dir``: every run downloads every index page and metadata file again, so it is always cold);
* **pip, cache on**: the same command with a persistent ``--cache-dir`` instead of ``--no-cache-dir``
  (not how the lock runs; what pip could do warm);
* **uv cold**: ``cudastack.lock.resolve_uv.uv_resolve`` with a new, empty uv cache each run;
* **uv warm**: the same with a cache filled by one untimed run.

Each is timed ``--repeat`` times (median, min, max). Then each install goes once through what
``lock.resolve_lock`` does with it (resolve with Requires-Dist, ``kept_pins`` of what the parent image holds,
a constrained re-resolve when a held version is to be kept, ``cuda_wheels.cohere``), with each resolver (uv
from an empty cache), and the final closures are compared with each other and with the committed lockfile
(what the locked images install): packages only in one, version and file differences, extras derived,
held versions kept. The parent image's held versions come from the committed lockfile (``lock._chain_pins``),
so both resolvers start from the same inputs. uv's requirements.txt form (``--generate-hashes``) is run once
per install to count its hashes. Every hash uv chose is checked against the index's published sha256
(``lock.verify_locked_hashes``), and the small installs (base venv tools, the suite's dependency) are
installed from uv's pins with pip in hash-checking mode (``lock.install_locked``).

Writes ``<out>/resolver_compare.md`` (the tables printed), ``resolver_compare.json`` (every timing) and
``resolver_time.png`` (time per install, log scale).

Usage: ``python benchmarks/resolver_compare.py [--cuda 12.8 --cuda 13.1] [--repeat 3] [--out results/resolver]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validate"))

from cudastack.lock import cuda_wheels  # noqa: E402
from cudastack import lock as L  # noqa: E402
from cudastack.lock.resolve import _chain_pins  # noqa: E402
from cudastack.lock import resolve_uv as U  # noqa: E402
from cudastack.core.errors import LockError  # noqa: E402
from cudastack.plan.planner import make_plan  # noqa: E402
from stackprobe import mdtable  # noqa: E402  (a table cell at most mdtable.LIMIT characters, issue 42)


# ----------------------------------------------------------------------------------------- timing
def pip_cached(cache_dir: str):
    """A pip_resolve that runs pip with ``--cache-dir cache_dir`` instead of ``--no-cache-dir`` (the rest of
    the command is the project's)."""
    real_run = subprocess.run

    def run(cmd, *a, **kw):
        if isinstance(cmd, list) and "--no-cache-dir" in cmd:
            cmd = [x for x in cmd if x != "--no-cache-dir"] + ["--cache-dir", cache_dir]
        return real_run(cmd, *a, **kw)

    def resolve(specs, **kw):
        L.subprocess.run = run
        try:
            return L.pip_resolve(specs, **kw)
        finally:
            L.subprocess.run = real_run
    return resolve


def timed(fn, repeat: int, before=None) -> list[float]:
    out = []
    for _ in range(repeat):
        if before:
            before()
        t0 = time.monotonic()
        fn()
        out.append(time.monotonic() - t0)
    return out


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


# ----------------------------------------------------------------------------------------- lock steps
def lock_install(resolve, inst: dict, held: dict, target: dict, kw: dict) -> dict:
    """One install through resolve_lock's steps with ``resolve`` (pip_resolve or uv_resolve). Returns the final
    closure, the Requires-Dist info, the pins kept, whether a constrained re-resolve ran, notes, seconds."""
    t0 = time.monotonic()
    requires: dict = {}
    pkgs = resolve(inst["specs"], requires=requires, no_deps=inst["no_deps"], **kw)
    first = pkgs
    keep = L.kept_pins(held, inst["specs"], pkgs, requires, target) if held else {}
    notes, reresolved = [], False
    if keep and any(p["version"] != keep.get(p["name"], p["version"]) for p in pkgs):
        reresolved = True
        try:
            pkgs = resolve(inst["specs"], constraints=keep, no_deps=inst["no_deps"], **kw)
        except LockError as e:
            notes.append(f"held versions not all kept: {str(e)[:200]}")
    if not inst["no_deps"]:
        pkgs, note = cuda_wheels.cohere(pkgs, requires, inst["specs"],
                                        lambda cons: resolve(inst["specs"], constraints={**keep, **cons},
                                                             no_deps=False, **kw))
        if note:
            notes.append(note[:160])
    return {"packages": pkgs, "first": first, "requires": requires, "kept": keep, "reresolved": reresolved,
            "notes": notes, "seconds": time.monotonic() - t0}


def diff(a: list[dict], b: list[dict]) -> dict:
    """Closure differences between ``a`` and ``b`` (``[{"name", "version", "filename", "sha256"}]``)."""
    da, db = {p["name"]: p for p in a}, {p["name"]: p for p in b}
    both = sorted(set(da) & set(db))
    return {"only_a": sorted(set(da) - set(db)), "only_b": sorted(set(db) - set(da)),
            "version": [f"{n} {da[n]['version']} / {db[n]['version']}" for n in both
                        if da[n]["version"] != db[n]["version"]],
            "file": [f"{n} {da[n]['filename']} / {db[n]['filename']}" for n in both
                     if da[n]["version"] == db[n]["version"] and da[n]["sha256"] != db[n]["sha256"]]}


def diff_text(d: dict, a: str, b: str) -> str:
    parts = []
    if d["only_a"]:
        parts.append(f"only {a}: {', '.join(d['only_a'])}")
    if d["only_b"]:
        parts.append(f"only {b}: {', '.join(d['only_b'])}")
    if d["version"]:
        parts.append(f"versions ({a} / {b}): {'; '.join(d['version'])}")
    if d["file"]:
        parts.append(f"files ({a} / {b}): {'; '.join(d['file'])}")
    return "; ".join(parts) or "identical (names, versions, files, sha256)"


def extras_diff(ra: dict, rb: dict) -> list[str]:
    out = []
    for n in sorted(set(ra) | set(rb)):
        ea, eb = (ra.get(n) or {}).get("extras", []), (rb.get(n) or {}).get("extras", [])
        if sorted(ea) != sorted(eb):
            out.append(f"{n}: pip [{','.join(sorted(ea))}] uv [{','.join(sorted(eb))}]")
    return out


# ----------------------------------------------------------------------------------------- main
def installs_of(toolchain: str):
    arch, base, skip = L.plan_options(toolchain, None, None, None)
    plan = make_plan(None, toolchain, archs=arch, base=base, skip=skip or ())
    locked = L.load_lock(toolchain)
    target = L.target_for_plan(plan, glibc=locked["resolver"]["glibc"])
    rows = []
    for node in plan.nodes:
        for arg, inst in L.node_installs(node).items():
            held = {} if arg in L.SEPARATE_PREFIX_INSTALLS or inst["no_deps"] else _chain_pins(plan, node, locked["nodes"])
            index = node.build_args.get("PIP_INDEX_URL", "")
            rows.append({"toolchain": toolchain, "node": node.name, "arg": arg, "inst": inst, "held": held,
                         "kw": {"target": target, "index": index, "extra_index": node.build_args.get("PIP_EXTRA_INDEX_URL", ""),
                                "where": f"node {node.name} ({arg})"},
                         "locked": ((locked["nodes"][node.name].get("installs") or {}).get(arg) or {}).get("packages", [])})
    return rows, target, locked


def fmt_t(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", action="append", help="toolchain (repeatable; default 12.8 and 13.1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "results" / "resolver"))
    ap.add_argument("--no-pip-cached", action="store_true", help="skip the pip-with-cache variant")
    ap.add_argument("--no-install", action="store_true", help="skip the hash-checked installs")
    args = ap.parse_args(argv)
    toolchains = args.cuda or ["12.8", "13.1"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="resolver-bench-"))
    uv = U.uv_binary()
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1]
    env = {"uv": U.uv_version(uv), "pip": pip_version, "python": platform.python_version(),
           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    say(f"pip {env['pip']}, uv {env['uv']}, host Python {env['python']}, {env['cpus']} cores, load {env['loadavg_start']:.1f}")

    results = []
    for tc in toolchains:
        rows, target, locked = installs_of(tc)
        say(f"CUDA {tc}: target {target}, {len(rows)} installs")
        for r in rows:
            label = f"{tc} {r['node']} {r['arg']}"
            specs, kw = r["inst"]["specs"], dict(r["kw"], no_deps=r["inst"]["no_deps"])
            pip_dir, uv_dir = work / "pip-cache", work / f"uv-warm-{tc}-{r['node']}-{r['arg']}"
            cold_dirs = iter(work / f"uv-cold-{tc}-{r['node']}-{r['arg']}-{i}" for i in range(args.repeat))
            t = {"pip": stats(timed(lambda: L.pip_resolve(specs, **kw), args.repeat))}
            if not args.no_pip_cached:
                cached = pip_cached(str(pip_dir))
                cached(specs, **kw)
                t["pip_cache_on"] = stats(timed(lambda: cached(specs, **kw), args.repeat))
            t["uv_cold"] = stats(timed(lambda: U.uv_resolve(specs, cache_dir=str(next(cold_dirs)), **kw), args.repeat))
            U.uv_resolve(specs, cache_dir=str(uv_dir), **kw)
            t["uv_warm"] = stats(timed(lambda: U.uv_resolve(specs, cache_dir=str(uv_dir), **kw), args.repeat))
            # the lock's steps, once each; uv from an empty cache
            base_kw = dict(r["kw"])
            lp = lock_install(L.pip_resolve, r["inst"], r["held"], target, base_kw)
            lu = lock_install(lambda s, **k: U.uv_resolve(s, cache_dir=str(work / f"uv-lock-{tc}-{r['node']}-{r['arg']}"), **k),
                              r["inst"], r["held"], target, base_kw)
            # uv's requirements.txt form of the same closure (its final pins as constraints), to count hashes
            hashes = U.requirements_hash_counts(specs, target=target, index=r["kw"]["index"], no_deps=r["inst"]["no_deps"],
                                                constraints={p["name"]: p["version"] for p in lu["packages"]},
                                                cache_dir=str(uv_dir))
            res = {"toolchain": tc, "node": r["node"], "arg": r["arg"], "specs": specs, "no_deps": r["inst"]["no_deps"],
                   "times": t, "lock_steps_s": {"pip": lp["seconds"], "uv": lu["seconds"]},
                   "n": {"pip": len(lp["packages"]), "uv": len(lu["packages"]), "locked": len(r["locked"]),
                         "pip_first": len(lp["first"]), "uv_first": len(lu["first"])},
                   "diff_first": diff(lp["first"], lu["first"]),
                   "diff_final": diff(lp["packages"], lu["packages"]),
                   "diff_uv_locked": diff(lu["packages"], r["locked"]),
                   "diff_pip_locked": diff(lp["packages"], r["locked"]),
                   "held": len(r["held"]),
                   "kept": {"pip": len(lp["kept"]), "uv": len(lu["kept"]),
                            "same": lp["kept"] == lu["kept"], "reresolved": [lp["reresolved"], lu["reresolved"]]},
                   "notes": {"pip": lp["notes"], "uv": lu["notes"]},
                   "extras_diff": extras_diff(lp["requires"], lu["requires"]),
                   "hashes": {"lock": len(lu["packages"]), "uv_requirements_txt": sum(hashes.values()),
                              "uv_requirements_txt_max": max(hashes.values() or [0])},
                   "uv_packages": lu["packages"]}
            results.append(res)
            (out / "partial.json").write_text(json.dumps(results, indent=1, default=str))
            say(f"  {label}: pip {t['pip']['median']:.2f}s uv cold {t['uv_cold']['median']:.2f}s warm "
                f"{t['uv_warm']['median']:.2f}s; closure {len(lp['packages'])}/{len(lu['packages'])}; "
                f"{diff_text(res['diff_final'], 'pip', 'uv')}")

    # ---- correctness: uv's hashes against the index, hash-checked installs of the small ones
    checks = {}
    for tc in toolchains:
        fake = {"lock_version": 1, "toolchain": tc, "cuda_version": tc, "nodes": {}}
        for r in (x for x in results if x["toolchain"] == tc):
            fake["nodes"].setdefault(r["node"], {"kind": "image", "index": L.DEFAULT_INDEX, "installs": {}})
            fake["nodes"][r["node"]]["installs"][r["arg"]] = {"requested": r["specs"], "no_deps": r["no_deps"],
                                                              "packages": r["uv_packages"]}
        try:
            v = L.verify_locked_hashes(fake, where=f"uv's {tc} closures")
            checks[f"{tc} sha256 vs index"] = (f"{v['index']} of {v['index'] + len(v['unchecked'])} uv sha256 "
                                               f"match the index's published hashes")
        except LockError as e:
            checks[f"{tc} sha256 vs index"] = f"FAILED: {e}"
        if not args.no_install:
            for node, arg in (("base", "VENV_PIP_SPECS"), ("runtime", "SUITE_PIP_SPECS")):
                dest = work / f"install-{tc}-{node}-{arg}"
                try:
                    got = L.install_locked(fake, node, arg, target_dir=dest)
                    checks[f"{tc} {node} {arg} pip --require-hashes"] = f"installed {len(got)}: {', '.join(got)}"
                except LockError as e:
                    checks[f"{tc} {node} {arg} pip --require-hashes"] = f"FAILED: {e}"
    env["loadavg_end"] = os.getloadavg()[0]

    md = render(results, checks, env, args.repeat)
    print(md)
    (out / "resolver_compare.md").write_text(md)
    for r in results:
        r.pop("uv_packages")
    (out / "resolver_compare.json").write_text(json.dumps({"env": env, "results": results, "checks": checks}, indent=1))
    plot(results, out / "resolver_time.png", env)
    (out / "partial.json").unlink(missing_ok=True)
    say(f"wrote {out}/resolver_compare.md, .json, resolver_time.png")
    return 0


def render(results: list[dict], checks: dict, env: dict, repeat: int) -> str:
    has_cached = all("pip_cache_on" in r["times"] for r in results)
    lines = [f"# Lock resolvers: pip {env['pip']} vs uv {env['uv']}", "",
             f"Measured {env['date']} by `benchmarks/resolver_compare.py` on a {env['cpus']}-core builder shared with "
             f"other work (load average {env['loadavg_start']:.1f} at start, {env['loadavg_end']:.1f} at end), "
             f"against PyPI through an HTTPS proxy. Target: CPython 3.11, manylinux glibc 2.36 (the images'). "
             f"Seconds: median (min-max) of {repeat} runs. Ratio: uv / pip, same run.", "",
             "| CUDA | node | install | pkgs pip / uv / lock | pip s (as locked, no cache) | "
             + ("pip s (cache on) | " if has_cached else "")
             + "uv cold s | uv warm s | uv cold / pip | uv warm / pip | lock steps pip / uv s | closure pip vs uv |",
             "| --- | --- | --- | --- | ---: | " + ("---: | " if has_cached else "") + "---: | ---: | ---: | ---: | ---: | --- |"]
    tot = {k: 0.0 for k in ("pip", "pip_cache_on", "uv_cold", "uv_warm", "lp", "lu")}
    for r in results:
        t = r["times"]
        for k in ("pip", "pip_cache_on", "uv_cold", "uv_warm"):
            if k in t:
                tot[k] += t[k]["median"]
        tot["lp"] += r["lock_steps_s"]["pip"]
        tot["lu"] += r["lock_steps_s"]["uv"]
        same = diff_text(r["diff_final"], "pip", "uv")
        lines.append(f"| {r['toolchain']} | {r['node']} | {r['arg']}{' (--no-deps)' if r['no_deps'] else ''} | "
                     f"{r['n']['pip']} / {r['n']['uv']} / {r['n']['locked']} | {fmt_t(t['pip'])} | "
                     + (f"{fmt_t(t['pip_cache_on'])} | " if has_cached else "")
                     + f"{fmt_t(t['uv_cold'])} | {fmt_t(t['uv_warm'])} | "
                     f"{t['uv_cold']['median'] / t['pip']['median']:.3f} | {t['uv_warm']['median'] / t['pip']['median']:.3f} | "
                     f"{r['lock_steps_s']['pip']:.1f} / {r['lock_steps_s']['uv']:.1f} | "
                     f"{'same' if same.startswith('identical') else same} |")
    lines.append(f"| all | | | {sum(r['n']['pip'] for r in results)} / {sum(r['n']['uv'] for r in results)} / "
                 f"{sum(r['n']['locked'] for r in results)} | {tot['pip']:.1f} | "
                 + (f"{tot['pip_cache_on']:.1f} | " if has_cached else "")
                 + f"{tot['uv_cold']:.1f} | {tot['uv_warm']:.1f} | {tot['uv_cold'] / tot['pip']:.3f} | "
                 f"{tot['uv_warm'] / tot['pip']:.3f} | {tot['lp']:.1f} / {tot['lu']:.1f} | |")
    lines += ["", "## Differences", "",
              "| CUDA | node | install | first resolution pip vs uv | final (after kept pins, CUDA coherence) vs committed lock: pip | ... uv | "
              "held by parent / kept pip / kept uv | extras derived differently | hashes: lock / uv requirements.txt (max per package) | notes |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        notes = "; ".join(f"{k}: {' | '.join(v)}" for k, v in r["notes"].items() if v) or ""
        kept = r["kept"]
        lines.append(f"| {r['toolchain']} | {r['node']} | {r['arg']} | {diff_text(r['diff_first'], 'pip', 'uv')} | "
                     f"{diff_text(r['diff_pip_locked'], 'pip', 'lock')} | {diff_text(r['diff_uv_locked'], 'uv', 'lock')} | "
                     f"{r['held']} / {kept['pip']} / {kept['uv']}{'' if kept['same'] else ' (different sets)'}"
                     f"{' (re-resolved)' if any(kept['reresolved']) else ''} | "
                     f"{'; '.join(r['extras_diff']) or 'none'} | {r['hashes']['lock']} / "
                     f"{r['hashes']['uv_requirements_txt']} ({r['hashes']['uv_requirements_txt_max']}) | "
                     f"{mdtable.short(notes.replace('|', '/'), 200, ' ... (resolver_compare.json has them whole)')} |")
    lines += ["", "## Checks of uv's pins", ""] + [f"- {k}: {v}" for k, v in checks.items()]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path, env: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['toolchain']} {r['node']}\n{r['arg']}" for r in results]
    series = [("pip", "pip (as locked)"), ("pip_cache_on", "pip, cache on"), ("uv_cold", "uv cold"),
              ("uv_warm", "uv warm")]
    series = [s for s in series if all(s[0] in r["times"] for r in results)]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(results) + 1.5))
    h = 0.8 / len(series)
    for i, (key, name) in enumerate(series):
        ys = [j + i * h for j in range(len(results))]
        med = [r["times"][key]["median"] for r in results]
        lo = [m - r["times"][key]["min"] for m, r in zip(med, results)]
        hi = [r["times"][key]["max"] - m for m, r in zip(med, results)]
        ax.barh(ys, med, height=h, label=name, xerr=[lo, hi], capsize=2)
    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(results))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds per resolution (median, bars min-max; log scale)")
    ax.set_title(f"Lock resolution per install: pip {env['pip']} vs uv {env['uv']} (CPython 3.11, manylinux_2_36)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
