import pytest

from wavepp.make_model import make_model

from .helpers import MAX_POSITIONS, VOCAB


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", num_layers=4,
                      hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                      vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS, seed=5)
