"""A tiny end-to-end `wavepp bench` on a random model at PP = 2: every output, and its schema."""

import json

import pytest

from wavepp.cli import main
from wavepp.cli.args import stage_blocks
from wavepp.random_checkpoint import make_model

KEYS = {
    "workload",
    "policy",
    "pp",
    "concurrency",
    "num_requests",
    "input_tokens",
    "cached_tokens",
    "seconds",
    "input_tok_s",
    "computed_tok_s",
    "hit_rate",
    "ideal_hit_rate",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "stage_utilization",
}


def test_tiny_bench_writes_table_json_plot_and_trace(tmp_path, capsys, monkeypatch):
    # a pinned projection path: every stage (rank 1 in its own process) must report it
    monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", "matmul")
    model = make_model(tmp_path / "m", num_layers=4, hidden_size=64, vocab_size=512)
    out = tmp_path / "b.json"
    plot = tmp_path / "b.png"
    trace = tmp_path / "b.trace.json"
    rc = main(
        [
            "bench",
            "--model",
            str(model),
            "--pp",
            "2",
            "--workload",
            "short-suffix,cold",
            "--policy",
            "wavepp,lockstep,static,single-stage",
            "--concurrency",
            "2,8",
            "--num-requests",
            "12",
            "--prefix-len",
            "96",
            "--suffix-len",
            "16",
            "--prompt-len",
            "64",
            "--num-groups",
            "3",
            "--dtype",
            "float32",
            "--json",
            str(out),
            "--plot",
            str(plot),
            "--trace",
            str(trace),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "short_suffix" in printed and "lockstep" in printed
    data = json.loads(out.read_text())
    stage_kernels = data["meta"]["kernels"]
    assert sorted(stage_kernels) == ["pp", "single"]
    assert len(stage_kernels["pp"]) == 2 and len(stage_kernels["single"]) == 1
    for k in stage_kernels["pp"] + stage_kernels["single"]:
        assert k.startswith("linear=matmul attention="), k
    assert "kernels (pp): stage 0 linear=matmul" in printed
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 4  # workloads x concurrencies x policies
    for row in rows:
        assert KEYS <= set(row), KEYS - set(row)
        assert row["num_failed"] == 0 and row["num_requests"] == 12
        assert len(row["stage_utilization"]) == (1 if row["policy"] == "single-stage" else 2)
        assert 0 <= row["hit_rate"] <= row["ideal_hit_rate"] + 1e-9
        assert (
            abs(row["input_tok_s"] * row["seconds"] - row["input_tokens"])
            < 1e-6 * row["input_tokens"] + 1
        )
        if row["workload"] == "cold":
            assert row["cached_tokens"] == 0 and row["ideal_hit_rate"] == 0
        else:  # 3 groups x 96-token prefixes: every later prompt of a group reuses 96 tokens
            assert row["ideal_hit_rate"] > 0.5
            assert row["hit_rate"] >= 0.98 * row["ideal_hit_rate"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"stage 0", "stage 1", "admission rounds"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["name"].startswith("wave") and e["tid"] == 1 for e in spans)
    assert any(e["name"].startswith("round") for e in spans)
    assert all(e["dur"] >= 0 for e in spans)


def test_default_request_count_gives_a_steady_state_at_every_concurrency():
    """With as many requests as the concurrency, all arrive at t = 0 and no admission ever
    overlaps execution; the default keeps 4 x c requests flowing through a run."""
    import argparse

    from wavepp.cli import bench as cli_bench

    parser = argparse.ArgumentParser()
    cli_bench.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench"])
    assert [cli_bench.requests_for(args, c) for c in (1, 8, 16, 64, 128)] == [64, 64, 64, 256, 512]
    args = parser.parse_args(["bench", "--num-requests", "12"])
    assert cli_bench.requests_for(args, 128) == 12


def test_stage_num_blocks_are_parsed_once_for_every_command():
    assert stage_blocks("40, 64") == (40, 64)
    assert stage_blocks(None) == () and stage_blocks("") == ()
    with pytest.raises(ValueError, match="--stage-num-blocks takes block counts"):
        stage_blocks("40,x")
