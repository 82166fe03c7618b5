import pytest
from gguf import GGMLQuantizationType as Q

from tests.engine.gguf.test_gguf_loader import tiny_hf_model, write_gguf
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


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """Tokenizers built from throwaway GGUF files are cached in a temporary folder, not the user's
    (a module applies it with ``pytestmark = pytest.mark.usefixtures("private_cache")``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFIXFLOW_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory):
    """The tiny random Llama written as a Q4_1 GGUF file."""
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf", tiny_hf_model(), qtype=Q.Q4_1)
