"""Fixtures shared by the validate tests that read the real SGLang and FlashInfer wheels (loaded from
tests/conftest.py as a pytest plugin). Each is module-scoped, as it was in the files it came from; the wheels
are pip-installed once into folders cached by :func:`validate_support.pip_target`. A test file that needs a
different set (test_validate_flashinfer's ``fi``, several releases) defines its own, which takes precedence."""
from __future__ import annotations

import pytest

from validate_support import fake_nvcc, pip_target, suite_venv


@pytest.fixture(scope="module")
def venv():
    """The Python that runs the suite (validate_support.suite_venv)."""
    return suite_venv()


@pytest.fixture(scope="module")
def sglang():
    """sglang 0.5.23 (CUDA 13.1's engine pin), installed without dependencies: a folder for PYTHONPATH."""
    return pip_target("sglang==0.5.23")


@pytest.fixture(scope="module")
def sglang059():
    """sglang 0.5.9 (CUDA 12.8's engine pin)."""
    return pip_target("sglang==0.5.9")


@pytest.fixture(scope="module")
def fi():
    """flashinfer-python 0.7.2 (CUDA 13.1's pin)."""
    return pip_target("flashinfer-python==0.7.2")


@pytest.fixture(scope="module")
def fi063():
    """flashinfer-python 0.6.3 (CUDA 12.8's pin)."""
    return pip_target("flashinfer-python==0.6.3")


@pytest.fixture(scope="module")
def kern():
    """sglang-kernel 0.4.10."""
    return pip_target("sglang-kernel==0.4.10")


@pytest.fixture(scope="module")
def nvcc131(tmp_path_factory):
    """A folder holding a fake ``nvcc`` that reports CUDA 13.1 (13.1.80), to put first on PATH."""
    return fake_nvcc(tmp_path_factory.mktemp("nvcc131") / "bin", "13.1", "13.1.80").parent


@pytest.fixture(scope="module")
def mscclpp_pkg(tmp_path_factory):
    """A folder where the modules PyMscclppCommunicator imports (``mscclpp``, ``mscclpp.ext``,
    ``mscclpp.default_algos``, sglang 0.5.23 ``pymscclpp.py:1047-1057``) are found, as the dispatch reader looks them
    up (nothing is imported)."""
    d = tmp_path_factory.mktemp("mscclpp")
    (d / "mscclpp").mkdir()
    for name in ("__init__.py", "ext.py", "default_algos.py"):
        (d / "mscclpp" / name).write_text("")
    return d
