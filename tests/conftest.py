import os
import warnings

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tokenizer():
    from lab.models import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny():
    from lab.models import tiny_target
    return tiny_target(0)


@pytest.fixture(scope="session")
def target():
    from lab.models import load_target
    return load_target()
