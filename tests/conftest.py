"""Suite-wide set-up. TRITON_INTERPRET must be set before anything imports triton, so it is set here,
at the top of the first conftest pytest loads. Tests use one torch thread for determinism."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Engines under --dtype auto (kvloop serve and bench runs in tests) would compile SmolLM2's step at start-up,
# minutes with a cold cache: they run eagerly; tests/engine/test_compiled_step.py
# compiles a tiny model instead.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

import pytest  # noqa: E402  (after the environment above, which must be set before torch/triton load)


@pytest.fixture(scope="session")
def checkpoint():
    """The embedded SmolLM2 checkpoint, loaded once for the whole run and shared by every test folder."""
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import embedded_model_path

    return load_checkpoint(embedded_model_path(), progress=False)


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_source(checkpoint.tokenizer_source)


@pytest.fixture(scope="session")
def fp32_model(checkpoint):
    """The model in fp32 (the exactness tests' dtype), with one torch thread for determinism."""
    import torch

    from kvloop.engine.model.llama import LlamaModel

    torch.set_num_threads(1)
    return LlamaModel(checkpoint.config, checkpoint.weights, torch.float32)


@pytest.fixture(scope="session")
def hf_model():
    """transformers' own loading of the same GGUF, in fp32: the reference for logits
    (model and engine tests)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from kvloop.engine.model.locate import embedded_model_path

    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    model.eval()
    return model
