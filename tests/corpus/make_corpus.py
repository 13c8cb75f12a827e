#!/usr/bin/python3
"""Writes the bad-message corpus: one JSON file per message that a worker must
survive, dead-letter with a reason, and (when the id is readable) answer with a
FAILURE. Run once; the files are committed. Bodies are given as base64 so any
bytes (invalid UTF-8, pickle) can be stored."""
import base64
import json
import os
import pickle

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad")


def v2_headers(task="llm.generate", tid="ID", **extra):
    h = {"lang": "py", "task": task, "id": tid, "shadow": None, "eta": None, "expires": None,
         "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
         "root_id": tid, "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}",
         "origin": "gen1@test", "ignore_result": False}
    h.update(extra)
    return h


def emit(name, body, reason, content_type="application/json", headers=None, id_known=True,
         exc_type=None):
    os.makedirs(HERE, exist_ok=True)
    if isinstance(body, str):
        body = body.encode("utf-8")
    doc = {"name": name, "content_type": content_type, "content_encoding": "utf-8",
           "headers": headers, "body_b64": base64.b64encode(body).decode(),
           "expect_reason": reason, "id_known": id_known, "exc_type": exc_type}
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

def nested(depth):
    d = {}
    for _ in range(depth):
        d = {"k": d}
    return d


# one header nested past the 64 levels a header may have: the others still
# name the task, and the dead letter keeps them
emit("deep_header", json.dumps([["x"], {}, EMBED]), "cannot decode",
     headers=v2_headers(deep=nested(70)), exc_type="DecodeError")
emit("bad_json", "{not json", "cannot decode", headers=v2_headers(), exc_type="DecodeError")
emit("empty_body", "", "cannot decode", headers=v2_headers(), exc_type="DecodeError")
emit("invalid_utf8", b'[["\xff\xfe bad"], {}, {}]', "cannot decode", headers=v2_headers(),
     exc_type="DecodeError")
emit("deep_nesting", "[" * 1000 + "]" * 1000, "cannot decode", headers=v2_headers(),
     exc_type="DecodeError")
emit("kwargs_not_mapping", json.dumps([["x"], ["not", "a", "dict"], EMBED]), "cannot decode",
     headers=v2_headers(), exc_type="InvalidTaskError")
emit("args_not_list", json.dumps([{"a": 1}, {}, EMBED]), "cannot decode", headers=v2_headers(),
     exc_type="InvalidTaskError")
emit("body_not_triple", json.dumps("just a string"), "cannot decode", headers=v2_headers(),
     exc_type="InvalidTaskError")
emit("missing_id_header", json.dumps([["x"], {}, EMBED]), "cannot decode",
     headers={"lang": "py", "task": "llm.generate"}, id_known=False)
emit("no_headers_list_body", json.dumps([["x"], {}, EMBED]), "cannot decode", headers=None,
     id_known=False)
emit("no_headers_dict_without_task", json.dumps({"id": "ID", "args": [], "kwargs": {}}),
     "cannot decode", headers=None, id_known=True, exc_type="InvalidTaskError")
emit("bad_eta", json.dumps([["x"], {}, EMBED]), "cannot decode",
     headers=v2_headers(eta="not a date"), exc_type="InvalidTaskError")
emit("bad_timelimit", json.dumps([["x"], {}, EMBED]), "cannot decode",
     headers=v2_headers(timelimit="soon"), exc_type="InvalidTaskError")
emit("pickle", pickle.dumps(((1, 2), {}, {}), protocol=4), "cannot decode",
     content_type="application/x-python-serialize", headers=v2_headers(),
     exc_type="ContentDisallowed")
emit("yaml", "- [1, 2]\n- {}\n- {}\n", "cannot decode", content_type="application/x-yaml",
     headers=v2_headers(), exc_type="ContentDisallowed")
emit("msgpack", b"\x93\x92\x01\x02\x80\x80", "cannot decode",
     content_type="application/x-msgpack", headers=v2_headers(), exc_type="ContentDisallowed")
emit("gzip_compressed", b"\x1f\x8b\x08\x00garbage", "cannot decode",
     headers=v2_headers(compression="application/x-gzip"), exc_type="ContentDisallowed")
emit("unknown_task", json.dumps([["x"], {}, EMBED]), "unregistered task",
     headers=v2_headers(task="no.such.task"), exc_type="NotRegistered")
emit("wrong_argument_type", json.dumps([[42], {}, EMBED]), "bad arguments",
     headers=v2_headers(), exc_type="TypeError")
emit("too_many_arguments", json.dumps([[1, 2, 3, 4, 5, 6], {}, EMBED]), "bad arguments",
     headers=v2_headers(), exc_type="TypeError")
emit("chat_messages_not_list", json.dumps([["hello"], {}, EMBED]), "bad arguments",
     headers=v2_headers(task="llm.chat"), exc_type="TypeError")
emit("v1_bad_kwargs", json.dumps({"task": "llm.generate", "id": "ID", "args": ["x"],
                                  "kwargs": [1]}), "cannot decode", headers={},
     exc_type="InvalidTaskError")
emit("hybrid_headers_task_body_garbage", "\x00\x01\x02", "cannot decode",
     headers=v2_headers(), exc_type="DecodeError")
