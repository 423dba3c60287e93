"""deploy/wavepp-lws.yaml against the parts of the LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)
and core v1 schemas it uses (no cluster here): field names and types, and that the
commands agree with the group (torchrun over LWS_GROUP_SIZE nodes, --pp equal to size, rank
from LWS_WORKER_INDEX, rank 0 serving the port the probes and the Service use)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "wavepp-lws.yaml"

# A subset of the CRD's OpenAPI schema and core v1 (PodSpec, Container, Probe, Service):
# dict: field -> schema; ("list", schema); a type; required fields marked with "!"
CONTAINER = {
    "name!": str,
    "image!": str,
    "command": ("list", str),
    "args": ("list", str),
    "env": ("list", {"name!": str, "value": str}),
    "ports": ("list", {"containerPort!": int, "name": str}),
    "readinessProbe": {
        "httpGet!": {"path!": str, "port!": int},
        "initialDelaySeconds": int,
        "periodSeconds": int,
    },
    "livenessProbe": {
        "httpGet!": {"path!": str, "port!": int},
        "initialDelaySeconds": int,
        "periodSeconds": int,
        "failureThreshold": int,
    },
    "resources": {"limits": dict, "requests": dict},
    "volumeMounts": ("list", {"name!": str, "mountPath!": str}),
}
POD_SPEC = {
    "containers!": ("list", CONTAINER),
    "volumes": ("list", {"name!": str, "persistentVolumeClaim": {"claimName!": str}}),
}
POD_TEMPLATE = {"metadata": {"labels": dict}, "spec!": POD_SPEC}
LWS = {
    "apiVersion!": str,
    "kind!": str,
    "metadata!": {"name!": str},
    "spec!": {
        "replicas": int,
        "leaderWorkerTemplate!": {
            "size!": int,
            "restartPolicy": str,
            "leaderTemplate": POD_TEMPLATE,
            "workerTemplate!": POD_TEMPLATE,
        },
    },
}
SERVICE = {
    "apiVersion!": str,
    "kind!": str,
    "metadata!": {"name!": str},
    "spec!": {
        "selector!": dict,
        "ports!": ("list", {"name": str, "port!": int, "targetPort": int}),
    },
}


def validate(value, schema, path="$"):
    if isinstance(schema, tuple):
        assert isinstance(value, list), f"{path}: expected a list"
        for i, item in enumerate(value):
            validate(item, schema[1], f"{path}[{i}]")
    elif isinstance(schema, dict):
        assert isinstance(value, dict), f"{path}: expected an object"
        fields = {k.rstrip("!"): v for k, v in schema.items()}
        for key in schema:
            if key.endswith("!"):
                assert key[:-1] in value, f"{path}.{key[:-1]} is required"
        for key, item in value.items():
            assert key in fields, f"{path}.{key} is not a field of this schema"
            validate(item, fields[key], f"{path}.{key}")
    else:
        assert isinstance(value, schema) and not (schema is int and isinstance(value, bool)), (
            f"{path}: expected {schema.__name__}, got {value!r}"
        )


def test_manifest_matches_the_schemas_and_the_group():
    lws, service = list(yaml.safe_load_all(MANIFEST.read_text()))
    validate(lws, LWS)
    validate(service, SERVICE)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    size = tmpl["size"]
    assert size >= 2
    for role in ("leaderTemplate", "workerTemplate"):
        (container,) = tmpl[role]["spec"]["containers"]
        assert container["command"][:2] == ["sh", "-c"]
        argv = shlex.split(container["command"][2])
        assert argv[0] == "torchrun"
        opts = dict(zip(argv[1:], argv[2:]))
        assert (
            opts["--nnodes"] == "$(LWS_GROUP_SIZE)" and opts["--node-rank"] == "$(LWS_WORKER_INDEX)"
        )
        assert opts["--master-addr"] == "$(LWS_LEADER_ADDRESS)" and opts["--nproc-per-node"] == "1"
        serve = argv[argv.index("-m") + 1 :]
        assert serve[:2] == ["wavepp.cli", "serve"]
        assert int(dict(zip(serve, serve[1:]))["--pp"]) == size  # one stage per node
        _parses(serve[2:])
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    port = int(dict(zip(argv, argv[1:]))["--port"])
    assert leader["ports"][0]["containerPort"] == port
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
    assert service["spec"]["ports"][0]["targetPort"] == port
    assert (
        service["spec"]["selector"]["role"] == tmpl["leaderTemplate"]["metadata"]["labels"]["role"]
    )
    assert re.fullmatch(r"[a-z0-9-]+", lws["metadata"]["name"])


def _parses(serve_args):
    """The serve options in the manifest are ones `wavepp serve` takes."""
    import argparse

    from wavepp.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", *serve_args])
    assert args.host == "0.0.0.0"
