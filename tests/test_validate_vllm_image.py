"""`invoke validate --engine vllm` inside the vLLM runtime image `invoke build --cuda 13.1 --only vllm` makes (vLLM's
own chain: torch 2.14.0, vllm 0.33.0, b12x 1.5.1, flashinfer-python 0.7.2.post1). Marked ``stack``: a 10.7 GB image
that CI does not build (the recipe and plan are covered without Docker in tests/test_recipes_vllm.py); it skips where
no such image is on the engine."""
from __future__ import annotations

import pytest

from cudastack.core.errors import StackError
from cudastack.jobs.validate import validate_image

pytestmark = [pytest.mark.stack, pytest.mark.docker]


@pytest.fixture(scope="module")
def vllm_image():
    from cudastack.core.docker_engine import docker_client

    client = docker_client()
    imgs = sorted(client.images.list(filters={"label": ["org.cudastack.kind=runtime", "org.cudastack.node=vllm"]}),
                  key=lambda i: i.attrs.get("Created", ""), reverse=True)
    tagged = [i.tags[0] for i in imgs if i.tags]
    if not tagged:
        pytest.skip("no vLLM runtime image on this engine (run `invoke build --cuda 13.1 --only vllm`)")
    return tagged[0]


def _v(report, backend):
    return next(v for v in report.verdicts if v.backend == backend and getattr(v, "scope", "") == "engine")


def test_the_vllm_image_answers_with_vllms_own_pins(vllm_image):
    r = validate_image(vllm_image, "12.0", world_size=8, topology="pcie", engine="vllm")
    env = r.environment
    assert env["torch"]["version"].startswith("2.14.0+cu130")          # vLLM's torch, not SGLang's 2.14.1
    assert env["packages"]["flashinfer-python"] == "0.7.2.post1" and env["packages"]["b12x"] == "1.5.1"
    assert not [f for f in env["health"]["findings"] if f.get("level") == "error"], env["health"]["findings"]
    assert r.provenance["image"]["node"] == "vllm"
    assert [e["name"] for e in r.engines] == ["vllm"] and r.engines[0]["dispatch"]["serves"] == "nccl-ring"
    assert _v(r, "vllm-custom-allreduce").status == "blocked" and _v(r, "vllm-custom-allreduce").gate == "topology"
    assert _v(r, "flashinfer-pcie-ipc-allreduce").status == "opt-in"
    assert _v(r, "b12x").status == "not-integrated"
    lib = next(v for v in r.verdicts if v.backend == "b12x" and getattr(v, "scope", "") == "library")
    assert lib.status == "gate-passes"            # in the image b12x's library answer reads; in a CPU venv it could not


def test_the_pcie_ipc_opt_in_serves_the_decode_allreduce_in_the_image(vllm_image):
    env = {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}
    r = validate_image(vllm_image, "12.0", world_size=8, topology="pcie", engine="vllm", extra_env=env, server_env=env)
    assert r.engines[0]["dispatch"]["serves"] == "flashinfer-pcie-ipc-allreduce"


def test_an_sglang_flag_is_refused_by_the_vllm_image_before_any_verdict(vllm_image):
    """Bad input: SGLang's --enable-symm-mem is no vLLM server argument; the run stops with a clear error."""
    with pytest.raises(StackError, match="--enable-symm-mem is not a server argument of the installed vllm 0.33.0") as e:
        validate_image(vllm_image, "12.0", world_size=8, topology="pcie", engine="vllm",
                       server_args="--enable-symm-mem")
    assert e.value.exit_code == 2, type(e.value)
