"""Issue 16: Celery's celery.map, celery.starmap and celery.chunks, sent by a real
Python Celery client, whose items celeriac runs as concurrent LLM calls."""
import re

import pytest
from celery.canvas import chunks, xmap, xstarmap
from celery.exceptions import NotRegistered

from conftest import wait_until


def in_progress(env):
    return sum(1 for s in env.fake.stats() if s["ended"] == "in_progress")


def test_map_runs_items_side_by_side_up_to_concurrency(env):
    env.worker("-c", "3")
    prompts = ["map item %d" % i for i in range(7)]
    env.fake.script(["hold=m"] * 7)
    r = xmap(env.app.signature("llm.generate"), prompts, app=env.app).apply_async()
    # Python would make one call after another: here three are held at once,
    # and a fourth only starts when a slot frees
    wait_until(lambda: in_progress(env) == 3, what="3 calls side by side")
    wait_until(lambda: env.workers[0].count("runs 7 items") == 1, what="map log line")
    assert in_progress(env) == 3 and len(env.fake.stats()) == 3
    env.fake.release("m")
    assert r.get(timeout=30) == [env.fake.expected_text(p) for p in prompts]
    assert len(env.fake.stats()) == 7
    meta = env.meta(r.id)
    assert meta["status"] == "SUCCESS"
    # the items have no results of their own: one meta, the map's
    assert len(env.redis.keys("celery-task-meta-*")) == 1


def test_map_results_in_item_order(env):
    env.worker("-c", "10")
    prompts = ["first", "second", "third", "fourth"]
    # the first item answers last
    env.fake.script(["latency_ms=900", "latency_ms=0", "latency_ms=300", "latency_ms=0"])
    r = xmap(env.app.signature("llm.generate"), prompts, app=env.app).apply_async()
    assert r.get(timeout=30) == [env.fake.expected_text(p) for p in prompts]
    ends = {s["prompt"]: s["t_end"] for s in env.fake.stats()}
    assert ends["first"] > ends["second"]


def test_starmap_unpacks_each_item(env):
    env.worker("-c", "10")
    items = [["alpha"], ["beta", None, "You are terse."]]
    r = xstarmap(env.app.signature("llm.generate"), items, app=env.app).apply_async()
    assert r.get(timeout=30) == [env.fake.expected_text("alpha"),
                                 env.fake.expected_text("beta")]
    systems = [s["body"]["messages"][0] for s in env.fake.stats()
               if s["prompt"] == "beta"]
    assert systems == [{"role": "system", "content": "You are terse."}]


def test_failing_item_fails_the_map(env):
    env.worker("-c", "10")
    # the model argument of the second item picks the fake's 400 scenario
    items = [["fine"], ["broken", "fake/status=400"], ["also fine"]]
    r = xstarmap(env.app.signature("llm.generate"), items, app=env.app).apply_async()
    with pytest.raises(Exception) as ei:
        r.get(timeout=30)
    assert type(ei.value).__name__ == "BadRequestError"
    meta = env.meta(r.id)
    assert meta["status"] == "FAILURE"
    assert meta["result"]["exc_type"] == "BadRequestError"


def test_unknown_inner_task_is_not_registered(env):
    w = env.worker("-c", "2")
    r = xmap(env.app.signature("proj.nowhere"), [1, 2], app=env.app).apply_async()
    with pytest.raises(NotRegistered):
        r.get(timeout=30)
    w.wait_for(re.escape("raised unexpected: NotRegistered('proj.nowhere')"))
    assert w.count("NotRegistered") == 2  # that line, and the dead letter's
    assert env.fake.stats() == []


def test_bad_it_is_a_type_error(env):
    env.worker("-c", "2")
    sig = dict(env.app.signature("llm.generate"))
    r = env.app.send_task("celery.map", kwargs={"task": sig, "it": 5})
    with pytest.raises(TypeError) as ei:
        r.get(timeout=30)
    assert "'int' object is not iterable" in str(ei.value)


def test_chunks_group_of_starmaps(env):
    env.worker("-c", "4")
    prompts = ["chunk %d" % i for i in range(5)]
    # the producer turns chunks(...)() into a group of celery.starmap tasks
    g = chunks(env.app.signature("llm.generate"), [[p] for p in prompts], 2,
               app=env.app)()
    want = [env.fake.expected_text(p) for p in prompts]
    assert g.get(timeout=30) == [want[0:2], want[2:4], want[4:5]]


def test_chunks_sent_as_a_task_runs_here(env):
    # a celery.chunks message (as a follow-up can send it) runs its parts here
    # and returns the parts' results, as the group's .get() would
    env.worker("-c", "4")
    sig = dict(env.app.signature("llm.generate"))
    prompts = ["part %d" % i for i in range(3)]
    r = env.app.send_task("celery.chunks",
                          kwargs={"task": sig, "it": [[p] for p in prompts], "n": 2})
    want = [env.fake.expected_text(p) for p in prompts]
    assert r.get(timeout=30) == [want[0:2], want[2:3]]


def test_revoke_terminate_aborts_the_running_items(env):
    w = env.worker("-c", "2")
    env.fake.script(["hold=never"] * 4)
    r = xmap(env.app.signature("llm.generate"), ["r%d" % i for i in range(4)],
             app=env.app).apply_async()
    wait_until(lambda: in_progress(env) == 2, what="2 calls held")
    r.revoke(terminate=True)
    wait_until(lambda: r.state == "REVOKED", 15, what="REVOKED")
    # the map settles only once its aborted calls are back: both held calls
    # were cut (the fake, holding, does not see it), the other items never called
    assert len(env.fake.stats()) == 2
    env.fake.release("never")
    assert w.count("Terminating celery.map") == 1
    # the worker is idle again: a task after it runs
    assert env.app.send_task("llm.generate", args=["after"]).get(timeout=20) == \
        env.fake.expected_text("after")


def test_map_item_falls_back_to_the_next_provider(env):
    """Items use the worker's model; routed to two providers, an item whose
    first provider fails before any text is asked of the second at once (no
    retry, no backoff), and the map's list has every item's answer."""
    import json
    doc = {"providers": {"first": {"type": "openai", "base_url": env.fake.base + "/v1"},
                         "second": {"type": "openai", "base_url": env.fake.base + "/v1"}},
           "models": {"m-fb": ["first/m-fb", "second/m-fb"]}}
    w = env.worker("-c", "1", "--llm-model", "m-fb", "--llm-providers", json.dumps(doc),
                   "--retry-backoff", "30")
    env.fake.script(["tokens=3", "status=503", "tokens=3"])
    prompts = ["one", "two"]
    r = xmap(env.app.signature("llm.generate"), prompts, app=env.app).apply_async()
    assert r.get(timeout=20) == [env.fake.expected_text(p, tokens=3) for p in prompts]
    assert [s["prompt"] for s in env.fake.stats()] == ["one", "two", "two"]
    assert w.count(r"item 1: first failed: .*trying the next provider") == 1
    assert w.count(r"item 1 retry in") == 0

