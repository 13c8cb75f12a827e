"""Issue 38, pools and cooled routes: a model route may be a pool of targets
("weighted" or "least-busy") that skips a target the provider cooled, and a
cooled route's calls go to its fallbacks instead of waiting. The targets are
two model names on the fake (pa, pb), told apart in its stats."""
import json
import signal
import time

from conftest import wait_until


def pool(strategy, weights=None, fallbacks=None, limits=None):
    route = {"targets": ["default/pa", "default/pb"], "strategy": strategy}
    if weights is not None:
        route["weights"] = weights
    if fallbacks is not None:
        route["fallbacks"] = fallbacks
    d = {"models": {"pool": route}}
    if limits:
        d["providers"] = {"default": {"limits": {"*": limits}}}
    return json.dumps(d)


def chat(env, text, model="pool", queue="celery"):
    return env.app.send_task("llm.chat", args=[[{"role": "user", "content": text}]],
                             kwargs={"model": model, "max_tokens": 2}, queue=queue)


def clean(ws):
    for w in ws:
        assert "Sanitizer" not in w.log() and "runtime error" not in w.log()


def models(env, since=0.0):
    return [s["model"] for s in env.fake.stats() if s["t"] >= since]


def test_weighted_shares(env):
    """Weights 3 and 1 over two workers: about 3:1 (each worker's smooth
    round-robin holds the exact shares over every 4 of its calls, so the
    fleet is off by less than one call per target and worker)."""
    for q in ("celery", "other"):
        env.worker("-c", "4", "-Q", q, "--llm-providers", pool("weighted", [3, 1]))
    rs = [chat(env, "w%d" % i, queue=("celery", "other")[i % 2]) for i in range(40)]
    for r in rs:
        assert r.get(timeout=30)["provider"] == "default"
    m = models(env)
    print("weighted [3, 1], 40 calls, 2 workers: pa %d, pb %d"
          % (m.count("pa"), m.count("pb")))
    assert len(m) == 40
    assert abs(m.count("pa") - 30) <= 2 and abs(m.count("pb") - 10) <= 2, m
    clean(env.workers)


def test_least_busy_across_the_fleet(env):
    """Worker A holds a call on pa; worker B, whose own counts are even, sends
    every call to the idle pb: it knows A's call from Redis."""
    env.worker("-c", "4", "--llm-providers", pool("least-busy"))
    b = env.worker("-c", "4", "-Q", "other", "--llm-providers", pool("least-busy"))
    env.fake.script(["hold=lb"], model="pa")
    env.fake.script(["hold=lb"], model="pb")
    held = chat(env, "held")
    wait_until(lambda: env.fake.held("lb") == 1, 20, what="the held call")
    busy = models(env)[0]
    idle = "pb" if busy == "pa" else "pa"
    env.fake.script([], model=busy)  # later calls there would not be held
    env.fake.script([], model=idle)
    time.sleep(0.8)  # a few of the fleet's views (every 200 ms)
    t0 = time.time()
    for i in range(6):
        chat(env, "b%d" % i, queue="other").get(timeout=20)
    later = models(env, t0)
    env.fake.release("lb")
    held.get(timeout=20)
    print("least-busy: a held call on %s; worker B sent %s" % (busy, later))
    assert later == [idle] * 6, later
    assert b.count("Redis away") == 0
    clean(env.workers)


def test_least_busy_forgets_a_killed_worker(env):
    """A worker killed with -9 while it holds a call: its count lives on in
    Redis for its lease (10 s), then counts for nothing and is swept."""
    a = env.worker("-c", "4", "--llm-providers", pool("least-busy"))
    env.worker("-c", "4", "-Q", "other", "--llm-providers", pool("least-busy"))
    env.fake.script(["hold=k9"], model="pa")
    chat(env, "held")
    wait_until(lambda: env.fake.held("k9") == 1, 20, what="the held call")
    key = "celeriac:pool:default/pa:busy"
    wait_until(lambda: env.redis.hlen(key) == 1, 5, interval=0.1, what="its count")
    a.signal(signal.SIGKILL)
    t_kill = time.time()
    env.fake.release("k9")  # the fake answers a connection nobody reads
    time.sleep(0.5)
    t0 = time.time()
    chat(env, "while counted", queue="other").get(timeout=20)
    assert models(env, t0) == ["pb"]
    wait_until(lambda: env.redis.hlen(key) == 0, 20, interval=0.1, what="the count swept")
    gone = time.time() - t_kill
    t0 = time.time()
    for i in range(4):
        chat(env, "after %d" % i, queue="other").get(timeout=20)
    after = models(env, t0)
    print("kill -9 holding a call on pa: its count gone after %.1f s; then %s"
          % (gone, after))
    assert 8 <= gone <= 12, gone
    assert sorted(after) == ["pa", "pa", "pb", "pb"], after


def test_cooled_target_skipped_by_the_fleet(env):
    """A 429 naming 5 s on pa: the call that got it goes to pb at once, and
    neither that worker nor another sends to pa until the cooling ends."""
    a = env.worker("-c", "4", "--llm-providers", pool("weighted", [1, 1]))
    env.worker("-c", "4", "-Q", "other", "--llm-providers", pool("weighted", [1, 1]))
    # a fresh smooth round-robin starts with the first target
    env.fake.script(["status=429;ra=5"], model="pa")
    first = chat(env, "refused")
    assert first.get(timeout=20)["content"]
    st = env.fake.stats()
    assert [(s["model"], s["status"]) for s in st] == [("pa", 429), ("pb", 200)], st
    cooled, other = "pa", "pb"
    a.wait_for(r"cooled for 5000 ms")
    t429 = st[0]["t"]
    time.sleep(0.6)  # the other worker reads the cooling within 200 ms
    rs = [chat(env, "after %d" % i, queue=("celery", "other")[i % 2]) for i in range(10)]
    for r in rs:
        r.get(timeout=20)
    after = env.fake.stats()[2:]
    print("cooled %s for 5 s: %d calls after, %s"
          % (cooled, len(after), [s["model"] for s in after]))
    assert len(after) == 10, after
    assert all(s["model"] == other and s["status"] == 200 for s in after), after
    assert max(s["t"] for s in after) - t429 < 4.5
    clean(env.workers)


def test_cooled_route_goes_to_its_fallback(env):
    """An ordered route under a limit: after a 429 naming 6 s on its first
    target, its calls go to the fallback at once rather than wait (they reach
    it before the cooling ends, whatever the machine's load); a route with no
    fallback still waits."""
    d = json.dumps({"providers": {"default": {"limits": {"*": {"rpm": 6000}}}},
                    "models": {"chain": ["default/ca", "default/cb"],
                               "alone": ["default/ca"]}})
    w = env.worker("-c", "8", "--llm-providers", d)
    env.fake.script(["status=429;ra=6"], model="ca")
    first = chat(env, "refused", model="chain")
    first.get(timeout=20)
    t429 = [s for s in env.fake.stats() if s["status"] == 429][0]["t"]
    w.wait_for(r"cooled for 6000 ms")
    t0 = time.time()
    rs = [chat(env, "next %d" % i, model="chain") for i in range(6)]
    for r in rs:
        r.get(timeout=20)
    wall = time.time() - t0
    alone = chat(env, "waits", model="alone")
    alone.get(timeout=20)
    st = env.fake.stats()
    st = st[[s["status"] for s in st].index(429) + 1:]
    print("after a 429 on ca (6 s): %s in %.2f s; the route without fallback: %.2f s "
          "after the 429" % ([s["model"] for s in st[:-1]], wall, st[-1]["t"] - t429))
    assert [s["model"] for s in st[:-1]] == ["cb"] * 7, st  # the refused one's too
    assert all(s["t"] - t429 < 5.9 for s in st[:-1]), (t429, st)
    assert st[-1]["model"] == "ca" and st[-1]["t"] - t429 >= 5.9, st[-1]
    assert w.count("cooled by the provider for") >= 6
    clean(env.workers)
