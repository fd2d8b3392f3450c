import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from hf_models import VARIANTS, save_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """variant name -> (folder, transformers model); each saved once per session."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            folder = tmp_path_factory.mktemp(variant)
            cache[variant] = (folder, save_hf_model(variant, folder))
        return cache[variant]
    return get
