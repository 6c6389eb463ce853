"""Suite-wide set-up. TRITON_INTERPRET must be set before anything imports triton, so it is set here,
at the top of the first conftest pytest loads. Tests use one torch thread for determinism."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
