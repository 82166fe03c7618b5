import pytest

from tests.engine.hf_models import ARCHITECTURES, make_model_dir


@pytest.fixture(scope="session")
def model_root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf_models")


@pytest.fixture(scope="session", params=sorted(ARCHITECTURES))
def arch_dir(request, model_root):
    return make_model_dir(model_root, request.param)


@pytest.fixture(scope="session")
def llama_dir(model_root):
    return make_model_dir(model_root, "llama-gqa-llama3rope")


@pytest.fixture(scope="session")
def quant_root(tmp_path_factory):
    """One folder for the quantized-checkpoint tests: the random bases are built once per session."""
    return tmp_path_factory.mktemp("quantized")
