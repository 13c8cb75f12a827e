"""RQ job data against CPython itself (protocol/rq_data.c, through the small
build/tests/rq_data_tool): for a few hundred seeded random plain values v,
CPython's pickle.dumps(json.loads(json.dumps(v)), protocol=5) must read back
as json.dumps of the same value, our writer must produce exactly CPython's
bytes, and pickle.loads of our bytes must give the value back. Needs no
services; `make build/tests/rq_data_tool` (or `make integration`) builds the tool."""
import json
import os
import pickle
import random
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "build", "tests", "rq_data_tool")

KEYS = ["role", "content", "model", "n", "x", "", "é", "temperature", "k" * 300]


def rand_str(r):
    kind = r.randrange(8)
    if kind == 0:
        return ""
    if kind == 1:
        return r.choice("aé\x7f~\u00ff")  # CPython's shared one-character strings
    if kind == 2:
        return "".join(r.choice("ab\u00e9\u2713\U0001f600\n\"\\") for _ in range(r.randrange(1, 12)))
    if kind == 3:
        return "w" * r.choice([255, 256, 1000])
    if kind == 4 and r.random() < 0.05:
        return "L" * 70000  # written outside frames
    return "".join(r.choice("abcdefghij ") for _ in range(r.randrange(1, 40)))


def rand_int(r, exact):
    lim = 2**53 if exact else 2**63
    return r.choice([
        r.randrange(256), r.randrange(65536), r.randrange(-2**31, 2**31),
        r.randrange(-lim, lim), -1, 2**31, -(2**31) - 1,
    ])


def rand_value(r, depth, exact):
    kind = r.randrange(10 if depth < 5 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return r.random() < 0.5
    if kind == 2:
        return rand_int(r, exact)
    if kind == 3:
        return r.choice([r.uniform(-1e6, 1e6), r.random(), 1e300, -0.0, 0.5, 1e-05])
    if kind in (4, 5):
        return rand_str(r)
    if kind in (6, 7):
        # Long lists (the batches of 1000) only hold scalars, to stay small.
        n = r.choice([0, 1, 2, 999, 1000, 1001, 2500]) if r.random() < 0.1 else r.randrange(5)
        sub = depth + 1 if n < 10 else 5
        return [rand_value(r, sub, exact) for _ in range(n)]
    n = r.choice([0, 1, 1001]) if r.random() < 0.1 else r.randrange(6)
    sub = depth + 1 if n < 10 else 5
    out = {}
    for i in range(n):
        key = r.choice(KEYS) if r.random() < 0.6 else "key%d" % i
        out[key] = rand_value(r, sub, exact)
    return out


def run_tool(mode, lines):
    p = subprocess.run([TOOL, mode], input="\n".join(lines) + "\n", capture_output=True,
                       text=True, check=True, timeout=120)
    out = p.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    return out


@pytest.fixture(scope="module")
def tool():
    if not os.path.exists(TOOL):
        subprocess.run(["make", "-C", ROOT, "build/tests/rq_data_tool"], check=True,
                       capture_output=True, timeout=300)
    return TOOL


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_python_pickles_read_back(tool, seed):
    r = random.Random(seed)
    values = [json.loads(json.dumps(rand_value(r, 0, exact=False))) for _ in range(150)]
    got = run_tool("loads", [pickle.dumps(v, protocol=5).hex() for v in values])
    for v, g in zip(values, got):
        assert g == json.dumps(v)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_our_pickles_are_cpythons(tool, seed):
    r = random.Random(seed)
    texts = [json.dumps(rand_value(r, 0, exact=True)) for _ in range(150)]
    got = run_tool("dumps", texts)
    for text, g in zip(texts, got):
        v = json.loads(text)
        assert not g.startswith("!"), g
        ours = bytes.fromhex(g)
        assert pickle.loads(ours) == v
        assert ours == pickle.dumps(v, protocol=5), text[:200]
    # The JSON serializer writes what json.dumps writes.
    assert run_tool("json", texts) == texts


def test_refused_objects(tool):
    import datetime
    import decimal
    cases = [
        (datetime.datetime(2026, 1, 1), "STACK_GLOBAL (0x93) 'datetime.datetime'"),
        (decimal.Decimal("2"), "STACK_GLOBAL (0x93) 'decimal.Decimal'"),
        ({1, 2}, "EMPTY_SET"),
        (complex(1, 2), "STACK_GLOBAL (0x93) 'builtins.complex'"),
        (float("nan"), "NaN"),
        (2**64, "LONG1"),
        ({(1, 2): 3}, "dict key"),
    ]
    got = run_tool("loads", [pickle.dumps(v, protocol=5).hex() for v, _ in cases])
    for (v, want), g in zip(cases, got):
        assert g.startswith("!") and want in g, (v, g)
