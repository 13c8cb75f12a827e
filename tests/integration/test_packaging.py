"""The deployment files parse and agree with the binary (no Docker engine here)."""
import os
import subprocess

import yaml

from conftest import BIN, ROOT


def test_docker_compose_parses_and_matches_the_cli():
    d = yaml.safe_load(open(os.path.join(ROOT, "docker-compose.yml")))
    svc = d["services"]
    assert {"rabbitmq", "redis", "worker", "gateway", "fake-llm"} <= set(svc)
    for name in ("worker", "gateway"):
        cmd = svc[name]["command"]
        helptext = subprocess.run([BIN, cmd[0], "--help"], capture_output=True,
                                  text=True).stdout
        for arg in cmd[1:]:
            if arg.startswith("-"):
                assert arg in helptext, "%s: %s is not an option" % (name, arg)
    assert svc["worker"]["environment"]["CELERY_BROKER_URL"].startswith("amqp://")
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    assert "FROM debian:12" in df and "make" in df
