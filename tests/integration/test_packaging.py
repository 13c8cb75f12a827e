"""The deployment files parse and agree with the binary (no Docker engine here).

The image's runtime packages are checked against what the binary really loads
on this Debian 12 host, the same distribution as the image: the libraries `ldd`
lists, and what the gateway and the metrics endpoint have mapped once they
serve (libwebsockets 4 finds its libuv event loop as a plugin, which no
library's dependencies pull in). Each object's package comes from `dpkg -S`, so
a new library linked in, and not added to the Dockerfile, fails here."""
import os
import re
import shlex
import subprocess
import urllib.request

import pytest
import yaml

from conftest import BIN, ROOT, LineReader, free_port

DEBIAN_12 = os.path.exists("/etc/debian_version") and \
    open("/etc/debian_version").read().startswith("12")
needs_debian_12 = pytest.mark.skipif(not DEBIAN_12, reason="the image is Debian 12; so must the host be")


def _compose():
    return yaml.safe_load(open(os.path.join(ROOT, "docker-compose.yml")))


def test_docker_compose_parses_and_matches_the_cli():
    svc = _compose()["services"]
    assert {"rabbitmq", "redis", "worker", "gateway", "fake-llm"} <= set(svc)
    for name in ("worker", "gateway"):
        cmd = svc[name]["command"]
        helptext = subprocess.run([BIN, cmd[0], "--help"], capture_output=True,
                                  text=True).stdout
        for arg in cmd[1:]:
            if arg.startswith("-"):
                assert arg in helptext, "%s: %s is not an option" % (name, arg)
        for var in svc[name].get("environment", {}):
            if var.startswith("CELERIAC_"):
                assert "[env: %s]" % var in helptext, "%s: %s is read by nothing" % (name, var)
    assert svc["worker"]["environment"]["CELERY_BROKER_URL"].startswith("amqp://")
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    assert "FROM debian:12" in df and "make" in df


def test_docker_compose_runs_a_current_rabbitmq_and_a_gateway_with_a_token():
    svc = _compose()["services"]
    # RabbitMQ 3.x is out of support; the worker is tested against 4.3's defaults.
    image = svc["rabbitmq"]["image"]
    m = re.match(r"rabbitmq:(\d+)(?:\.(\d+))?", image)
    assert m and int(m.group(1)) >= 4, image
    # The gateway listens on 0.0.0.0 in its container: never without a token, and
    # the token is the user's, from their environment, not one written here.
    gw = svc["gateway"]
    token = gw.get("environment", {}).get("CELERIAC_AUTH_TOKEN")
    cmd = gw["command"]
    if "--auth-token" in cmd:
        token = cmd[cmd.index("--auth-token") + 1]
    assert token, "the gateway runs without --auth-token"
    assert re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*(:?\?[^}]*)?\}", str(token)), \
        "the token must come from a variable with no default: %r" % token


def _dockerignored(patterns, path):
    """Docker's rule, enough for these files: a pattern names a path from the
    context's root (`*` within a name, `**` over directories) and takes all below it."""
    for pat in patterns:
        rx = ""
        for part in re.split(r"(\*\*/|\*)", pat):
            rx += {"**/": "(?:.*/)?", "*": "[^/]*"}.get(part, re.escape(part))
        if re.match(rx + "(?:/|$)", path):
            return True
    return False


def test_dockerignore_keeps_host_builds_out_of_the_image():
    # With build/ in the context, `make` in the image finds the host's newer
    # objects up to date and puts a binary linked on the host into the image.
    path = os.path.join(ROOT, ".dockerignore")
    assert os.path.exists(path), "no .dockerignore"
    pats = [l.strip().strip("/") for l in open(path) if l.strip() and not l.startswith("#")]
    for out in ("build/celeriac", "build-asan/x.o", ".git/HEAD", "tests/browser/node_modules/x",
                "tests/integration/__pycache__/conftest.pyc"):
        assert _dockerignored(pats, out), "%s is sent to the Docker build" % out
    for needed in ("Makefile", "cmd/main.c", "util/log.h", "scripts/fake_llm.py"):
        assert not _dockerignored(pats, needed), "%s is kept out of the Docker build" % needed


# ----------------------------------------------------------- runtime packages

def runtime_stage_packages(dockerfile):
    """The packages `apt-get install` names in the Dockerfile's last stage."""
    text = re.sub(r"\\\n", " ", open(dockerfile).read())
    stage = re.split(r"(?m)^FROM\s", text)[-1]
    pkgs = []
    for m in re.finditer(r"apt-get\s+install\s+([^&;\n]*)", stage):
        pkgs += [w for w in shlex.split(m.group(1)) if not w.startswith("-")]
    return pkgs


def packages_of(paths):
    """{shared object: the Debian package that ships it}. Debian 12 merges /lib
    into /usr/lib, and dpkg knows each file by the one name its package used, so
    every spelling of a path is asked for (in one dpkg-query: each call reads
    every package's file list)."""
    spellings = {}
    for path in paths:
        real = os.path.realpath(path)
        for p in (path, real, os.path.join(os.path.dirname(path), os.path.basename(real))):
            for q in (p, p[4:] if p.startswith("/usr/") else "/usr" + p):
                spellings.setdefault(q, set()).add(path)
    out = subprocess.run(["dpkg-query", "-S", *sorted(spellings)], capture_output=True,
                         text=True).stdout
    owner = {}
    for line in out.splitlines():
        pkg, _, f = line.partition(": ")
        for path in spellings.get(f.strip(), ()):
            owner[path] = pkg.split(",")[0].split(":")[0].strip()
    unowned = sorted(set(paths) - set(owner))
    assert not unowned, "no package ships %s" % unowned
    return owner


def linked_objects(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    # "libx.so.1 => /path (0x...)", and the loader itself as "/path (0x...)".
    return re.findall(r"(?m)(?:=>\s+|^\s+)(/\S+) \(0x", out)


def _installed(field_fmt):
    out = subprocess.run(["dpkg-query", "-W", "-f", field_fmt], capture_output=True,
                         text=True, check=True).stdout
    return [l.split("\t") for l in out.splitlines() if l]


def dependency_closure(pkgs):
    """Every package apt installs for pkgs (Depends and Pre-Depends; the first
    installed choice of an alternative; virtual names through Provides)."""
    deps, provides = {}, {}
    for name, status, dep, pre, prov in _installed(
            "${Package}\t${db:Status-Abbrev}\t${Depends}\t${Pre-Depends}\t${Provides}\n"):
        if not status.startswith("ii"):
            continue
        deps[name] = ", ".join(d for d in (dep, pre) if d)
        for p in prov.split(","):
            if p.strip():
                provides.setdefault(p.split()[0].split(":")[0], name)
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        p = p if p in deps else provides.get(p, p)
        if p in seen:
            continue
        seen.add(p)
        for group in filter(None, (g.strip() for g in deps.get(p, "").split(","))):
            alts = [a.split()[0].split(":")[0] for a in group.split("|")]
            have = [a for a in alts if a in deps or a in provides]
            if have:
                todo.append(have[0])
    return seen


def mapped_objects(pid):
    """The shared objects a running process has loaded, dlopened ones included.
    glibc's NSS and gconv modules are left out: which of those load depends on
    the host's nsswitch.conf and locale, not on celeriac."""
    objs = set()
    for line in open("/proc/%d/maps" % pid):
        f = line.split(None, 5)[-1].strip()
        name = os.path.basename(f)
        if f.startswith("/") and re.search(r"\.so(\.|$)", name) and \
                not name.startswith("libnss_") and "/gconv/" not in f and os.path.isfile(f):
            objs.add(f)
    return objs


class _Proc(LineReader):
    def __init__(self, args, extra_env=None):
        e = dict(os.environ)
        e.update(extra_env or {})
        self.read_lines(subprocess.Popen([BIN, *args], env=e, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, errors="replace"))


@needs_debian_12
def test_runtime_stage_installs_what_the_binary_and_its_plugins_load(env):
    # What the gateway and the worker's metrics endpoint have loaded once they serve.
    loaded = set()
    gw = _Proc(["gateway", "-b", env.broker, "--result-backend", env.backend, "--port", "0"])
    try:
        m = gw.wait_for(r"gateway listening on http://([0-9.]+):(\d+)/", timeout=60)
        with urllib.request.urlopen("http://%s:%s/healthz" % m.groups(), timeout=20) as r:
            assert r.status == 200
        loaded |= mapped_objects(gw.proc.pid)
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])
    port = free_port()
    wk = _Proc(["worker", "-b", env.broker, "--result-backend", env.backend,
                "--metrics-port", str(port), "-l", "info"],
               {"OPENAI_BASE_URL": env.fake.base + "/v1", "OPENAI_API_KEY": "sk-test"})
    try:
        wk.wait_for(r"metrics: serving /metrics", timeout=60)
        with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=20) as r:
            assert r.status in (200, 503)
        loaded |= mapped_objects(wk.proc.pid)
    finally:
        wk.stop()
    linked = linked_objects(BIN)
    same = {os.path.realpath(o) for o in linked}
    plugins = sorted(o for o in loaded if os.path.realpath(o) not in same)
    assert any("evlib_uv" in os.path.basename(p) for p in plugins), \
        "libwebsockets loaded no libuv plugin: %s" % plugins

    listed = runtime_stage_packages(os.path.join(ROOT, "Dockerfile"))
    assert listed, "no apt-get install in the Dockerfile's runtime stage"
    dev = [p for p in listed if p.endswith("-dev")]
    assert not dev, "build-only packages in the runtime stage: %s" % dev

    # What the binary links directly and what is dlopened is named in the list;
    # everything else it loads must come in through those packages' dependencies.
    needed = subprocess.run(["objdump", "-p", BIN], capture_output=True, text=True,
                            check=True).stdout
    direct_names = set(re.findall(r"NEEDED\s+(\S+)", needed))
    direct = [o for o in linked if os.path.basename(o) in direct_names] + plugins
    # libc6 is every image's own (and dpkg's, so never removable).
    owner = packages_of(set(linked) | loaded)
    must_name = {owner[o] for o in direct} - {"libc6"}
    missing = sorted(must_name - set(listed))
    assert not missing, "Dockerfile's runtime stage lacks %s (for %s)" % (
        missing, [o for o in direct if owner[o] in missing])

    closure = dependency_closure(listed + ["libc6"])
    unreached = {p: o for o, p in owner.items() if p not in closure}
    assert not unreached, "loaded but installed by nothing in the runtime stage: %s" % unreached
