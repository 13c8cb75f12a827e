"""HTTPS to the LLM provider: the worker against the fake LLM through a private
nginx that terminates TLS and speaks HTTP/2 (scripts/tls_front.py), with the
front's CA given by --llm-ca-file. Calls held open at the fake all at once
must share a few connections (HTTP/2 streams) rather than one each, as
nginx's access log shows; a worker that does not trust the front's CA never
reaches the fake."""
import os
import sys

import pytest

from conftest import ROOT, wait_until

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from tls_front import TlsFront  # noqa: E402

# Its module fixtures (a TLS front) start once: the file runs on one worker.
pytestmark = pytest.mark.xdist_group("llm_tls")

N_CALLS = 50


@pytest.fixture(scope="module")
def front(fake_llm_server, tmp_path_factory):
    f = TlsFront(fake_llm_server.port, str(tmp_path_factory.mktemp("tls-front")))
    f.start()
    yield f
    f.stop()


def test_calls_multiplex_over_tls(env, front):
    front.reset()
    env.worker("--llm-ca-file", front.ca_file, "--llm-http2", "-c", str(N_CALLS),
               env={"OPENAI_BASE_URL": front.base_url})
    prompts = ["over tls %d" % i for i in range(N_CALLS)]
    rs = [env.app.send_task("llm.generate", args=[p], kwargs={"model": "fake/hold=tls"})
          for p in prompts]
    # Every call in flight at once, held at the fake until released.
    wait_until(lambda: len(env.fake.stats()) >= N_CALLS, timeout=60,
               what="%d calls held at the fake" % N_CALLS)
    env.fake.release("tls")
    for p, r in zip(prompts, rs):
        assert r.get(timeout=60) == env.fake.expected_text(p)
    st = front.stats()
    assert st["requests"] == N_CALLS
    assert st["h2_requests"] == N_CALLS
    # One TLS handshake per connection: far fewer than calls.
    assert 1 <= st["connections"] < N_CALLS // 5, st


def test_untrusted_front_is_never_called(env, front):
    front.reset()
    env.worker("--max-retries", "0", env={"OPENAI_BASE_URL": front.base_url})
    r = env.app.send_task("llm.generate", args=["not trusted"])
    with pytest.raises(Exception) as e:
        r.get(timeout=60)
    assert "certificate" in str(e.value).lower() or "ssl" in str(e.value).lower(), e.value
    assert env.fake.stats() == []
    assert front.stats()["requests"] == 0
