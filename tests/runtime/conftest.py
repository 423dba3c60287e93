import pytest

from wavepp.random_checkpoint import make_model

from .helpers import MAX_POSITIONS, VOCAB


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(
        tmp_path_factory.mktemp("tiny") / "llama",
        arch="llama",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        seed=5,
    )


@pytest.fixture(scope="module")
def big_tiny(tmp_path_factory):
    """The tiny model with room for the profiling pass's longest waves (4,096 positions)."""
    return make_model(
        tmp_path_factory.mktemp("big_tiny") / "llama",
        arch="llama",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        seed=5,
    )


@pytest.fixture
def mooncake_master(tmp_path):
    """A real mooncake_master on loopback for one test (killed after it)."""
    from ..mooncake_master import MooncakeMaster

    master = MooncakeMaster(tmp_path).start()
    yield master
    master.kill()
