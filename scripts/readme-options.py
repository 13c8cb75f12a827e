#!/usr/bin/python3
"""Writes the worker's option table into README.md between the options markers,
from `celeriac worker --help`, so the README always lists every option.
    scripts/readme-options.py [--check]   (--check: exit 1 if README is stale)"""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = subprocess.run([os.path.join(root, "build", "celeriac"), "worker", "--help"],
                     capture_output=True, text=True, check=True).stdout
rows = ["| option | environment | default | meaning |", "| --- | --- | --- | --- |"]
for line in out.splitlines():
    m = re.match(r"\s+(-\w, )?(--[\w-]+)\s+(.*)$", line)
    if not m or m.group(2) == "--help":
        continue
    text = m.group(3)
    env = re.search(r"\[env: ([^\]]+)\]", text)
    dflt = re.search(r"\[default: ([^\]]*)\]", text)
    meaning = re.sub(r"\s*\[(env|default): [^\]]*\]", "", text).strip()
    flag = (m.group(1) or "") + m.group(2)
    rows.append("| `%s` | %s | %s | %s |" % (flag, "`%s`" % env.group(1) if env else "",
                                           "`%s`" % dflt.group(1) if dflt else "",
                                           meaning.replace("|", "\\|")))
table = "\n".join(rows)
path = os.path.join(root, "README.md")
readme = open(path).read()
new = re.sub(r"(<!-- options:begin -->\n).*?(<!-- options:end -->)",
             lambda m: m.group(1) + table + "\n" + m.group(2), readme, flags=re.S)
if "--check" in sys.argv:
    sys.exit(0 if new == readme else 1)
open(path, "w").write(new)
