"""--kv-events-config: vLLM's fields and defaults; every bad input a clear error naming it."""

import pytest

from wavepp.cli import main
from wavepp.kv_events import KVEventsConfig


def test_vllm_defaults_and_the_publisher_that_follows_enable():
    off = KVEventsConfig.from_json("{}")
    assert (off.publisher, off.endpoint, off.buffer_steps, off.hwm, off.max_queue_size) == (
        "null",
        "tcp://*:5557",
        10_000,
        100_000,
        100_000,
    )
    assert not off.publishes
    on = KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "topic": "kv",'
        ' "replay_endpoint": "tcp://*:6001"}'
    )
    assert on.publisher == "zmq" and on.publishes and on.topic == "kv"
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").publishes


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"enable_kv_cache_event": true}', "unknown field(s) 'enable_kv_cache_event'"),
        ('{"publisher": "kafka"}', "publisher must be 'zmq' or 'null'"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events must be true or false"),
        ('{"endpoint": "localhost:5557"}', "endpoint must be a ZeroMQ address"),
        ('{"max_queue_size": 0}', "max_queue_size must be a positive integer"),
        ('{"hwm": 1.5}', "hwm must be a positive integer"),
        ('{"topic": 3}', "topic must be a string"),
    ],
)
def test_bad_configs_are_named(text, words):
    with pytest.raises(ValueError) as err:
        KVEventsConfig.from_json(text)
    assert words in str(err.value)


def test_the_command_line_refuses_a_bad_config_before_starting(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--kv-events-config", '{"enable_kv_cache_events": true, "port": 1}'])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--kv-events-config" in err and "unknown field(s) 'port'" in err


def test_the_engine_options_take_the_config_its_json_or_a_dict():
    from wavepp.engine_config import EngineConfig

    text = '{"enable_kv_cache_events": true, "topic": "kv"}'
    for given in (
        KVEventsConfig.from_json(text),
        text,
        {"enable_kv_cache_events": True, "topic": "kv"},
    ):
        config = EngineConfig(kv_events=given)
        assert config.kv_events.topic == "kv" and config.publishes_kv_events
    assert not EngineConfig().publishes_kv_events
    with pytest.raises(ValueError, match="kv_events: unknown field"):
        EngineConfig(kv_events={"enable": True})
    with pytest.raises(ValueError, match="kv_events: takes a KVEventsConfig"):
        EngineConfig(kv_events=5)
