#!/usr/bin/python3
"""Writes the option tables of `celeriac worker` and `celeriac gateway` into
README.md between their markers (<!-- options:begin/end --> for the worker,
<!-- gateway-options:begin/end --> for the gateway), from each command's
--help, so the README always lists every option.
    scripts/readme-options.py [--check]   (--check: exit 1 if README is stale)"""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table(command):
    out = subprocess.run([os.path.join(root, "build", "celeriac"), command, "--help"],
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
    return "\n".join(rows)


path = os.path.join(root, "README.md")
readme = open(path).read()
new = readme
for marker, command in (("options", "worker"), ("gateway-options", "gateway")):
    rows = table(command)
    new, n = re.subn(r"(<!-- %s:begin -->\n).*?(<!-- %s:end -->)" % (marker, marker),
                     lambda m: m.group(1) + rows + "\n" + m.group(2), new, flags=re.S)
    if n != 1:
        sys.exit("README.md: no <!-- %s:begin --> ... <!-- %s:end --> section"
                 % (marker, marker))
if "--check" in sys.argv:
    sys.exit(0 if new == readme else 1)
open(path, "w").write(new)
