"""make install, make deb and the man pages (issue 36): the layout install
writes, the pages against --help, the package's dependencies, and the package
installed into a fresh Debian 12 root (root only; scripts/test-deb.sh)."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import BIN, ROOT

BUILD = os.path.dirname(os.path.abspath(BIN))
# Two of these tests run `make deb` into the same build directory: on two
# xdist workers at once they wrote the same package and staging tree.
pytestmark = pytest.mark.xdist_group("install")


def commands():
    """The commands `celeriac --help` lists."""
    out = subprocess.run([BIN, "--help"], capture_output=True, text=True, check=True).stdout
    block = out.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in block.splitlines() if line.strip()]
    assert "worker" in names
    return names


def make(*args, timeout=600):
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "BUILD=" + BUILD]
                       + list(args), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def files_under(d):
    return sorted(os.path.relpath(os.path.join(p, f), d)
                  for p, _, fs in os.walk(d) for f in fs)


def stand_in_unit(tmp_path):
    unit = tmp_path / "celeriac.service"
    unit.write_text("[Service]\nEnvironmentFile=-/etc/default/celeriac\n"
                    "ExecStart=/usr/bin/celeriac worker $CELERIAC_OPTS\n")
    return str(unit)


def test_make_install_lays_out_binary_pages_unit_and_defaults(tmp_path):
    dest = tmp_path / "dest"
    make("install", "DESTDIR=%s" % dest, "PREFIX=/usr", "UNIT=" + stand_in_unit(tmp_path))
    pages = ["usr/share/man/man1/celeriac.1"] + [
        "usr/share/man/man1/celeriac-%s.1" % c for c in commands()]
    assert files_under(dest) == sorted(
        ["usr/bin/celeriac", "usr/lib/systemd/system/celeriac.service",
         "etc/default/celeriac"] + pages)
    assert os.access(dest / "usr/bin/celeriac", os.X_OK)
    assert (dest / "etc/default/celeriac").read_text() == open(
        os.path.join(ROOT, "packaging/celeriac.default")).read()
    # An edited defaults file survives the next install.
    (dest / "etc/default/celeriac").write_text("CELERY_BROKER_URL=amqp://mine//\n")
    make("install", "DESTDIR=%s" % dest, "PREFIX=/usr")
    assert (dest / "etc/default/celeriac").read_text() == "CELERY_BROKER_URL=amqp://mine//\n"


def test_make_install_under_usr_local_points_the_unit_at_its_binary(tmp_path):
    dest = tmp_path / "dest"
    make("install", "DESTDIR=%s" % dest, "UNIT=" + stand_in_unit(tmp_path))
    got = files_under(dest)
    assert "usr/local/bin/celeriac" in got
    assert "usr/local/share/man/man1/celeriac-worker.1" in got
    assert not [f for f in got if f.startswith("etc/")], got
    unit = (dest / "usr/local/lib/systemd/system/celeriac.service").read_text()
    assert "ExecStart=/usr/local/bin/celeriac worker $CELERIAC_OPTS\n" in unit


def roff_page(cmd):
    r = subprocess.run([BIN, "help-man", cmd], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("cmd", ["worker", "gateway", "dlq", "top", "rq"])
def test_every_option_of_help_is_in_the_man_page(cmd):
    assert cmd in commands()
    helptext = subprocess.run([BIN, cmd, "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", helptext, re.M))
    envs = set(re.findall(r"\[env: (\w+)\]", helptext))
    assert len(flags) >= 3
    page = roff_page(cmd).replace("\\-", "-")
    for flag in flags:
        assert "\\fB%s\\fR" % flag in page, "%s: %s not in the man page" % (cmd, flag)
    for env in envs:
        assert "\\fB%s\\fR" % env in page
    # and groff formats it without a warning
    r = subprocess.run(["man", "--warnings", "-l", "-"], input=roff_page(cmd),
                       capture_output=True, text=True, env=dict(os.environ, MANWIDTH="80"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "celeriac-%s" % cmd in r.stdout


def test_defaults_file_uses_variables_the_worker_reads():
    helptext = subprocess.run([BIN, "worker", "--help"], capture_output=True,
                              text=True).stdout
    envs = set(re.findall(r"\[env: (\w+)\]", helptext))
    text = open(os.path.join(ROOT, "packaging/celeriac.default")).read()
    names = re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, re.M)
    assert {"CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "CELERIAC_OPTS"} <= set(names)
    assert [n for n in names if n not in envs and n != "CELERIAC_OPTS"] == []


def test_deb_depends_on_every_library_and_the_libuv_plugin():
    deb = make("deb").strip().splitlines()[-1]
    deb = os.path.join(ROOT, deb) if not os.path.isabs(deb) else deb
    depends = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], capture_output=True,
                             text=True, check=True).stdout
    pkgs = {d.split()[0] for d in depends.replace("\n", " ").split(",")}
    assert {"libwebsockets-evlib-uv", "adduser"} <= pkgs
    # Every library the binary names (DT_NEEDED) comes from a package the deb
    # depends on: the package that holds it on this machine.
    needed = re.findall(r"NEEDED\s+(\S+)", subprocess.run(
        ["objdump", "-p", BIN], capture_output=True, text=True, check=True).stdout)
    ldd = dict(re.findall(r"^\s*(\S+) => (/\S+)", subprocess.run(
        ["ldd", BIN], capture_output=True, text=True, check=True).stdout, re.M))
    assert "libwebsockets.so.17" in needed
    for name in needed:
        lib = ldd[name]
        owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
        if owner.returncode:
            owner = subprocess.run(["dpkg", "-S", os.path.realpath(lib)],
                                   capture_output=True, text=True)
        pkg = owner.stdout.split(":")[0]
        # libcap comes with libwebsockets' link flags, but no symbol of it is
        # used (dpkg-shlibdeps leaves it out); libwebsockets17 depends on it.
        if pkg == "libcap2":
            continue
        assert pkg in pkgs, "%s (%s) is not in Depends: %s" % (lib, pkg, depends)
    listing = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True).stdout
    assert "./usr/share/man/man1/celeriac-worker.1.gz" in listing
    assert "./etc/default/celeriac" in listing


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("debootstrap"),
                    reason="needs root and debootstrap")
def test_deb_installs_and_runs_in_a_fresh_debian_12_root():
    make("deb")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts/test-deb.sh"), BUILD],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: celeriac worker --help runs" in r.stdout
    assert "ok: man -w celeriac-worker" in r.stdout
