# celeriac -- native Celery worker for LLM jobs.
# Targets: all man install deb test test-rabbitmq4 test-deb unit integration demo bench asan
#          valgrind fuzz format check-src check-src-selftest clean

PKGS      := librabbitmq libcurl libcjson hiredis libuv libwebsockets libpcre2-8 openssl
CC        ?= cc
BUILD     ?= build
WARNINGS  := -Wall -Wextra -Werror -Wstrict-prototypes -Wwrite-strings \
	         -Wno-missing-field-initializers
OPT       ?= -O2 -g
CFLAGS    += -std=c11 -D_GNU_SOURCE $(OPT) $(WARNINGS) -MMD -MP \
	         $(shell pkg-config --cflags $(PKGS)) -I.
LDLIBS    += $(shell pkg-config --libs $(PKGS)) -lz -lm
CHECK_LIBS = $(shell pkg-config --libs check)
CHECK_CFLAGS = $(shell pkg-config --cflags check)

LIB_SRC   := $(wildcard util/*.c protocol/*.c llm/*.c net/*.c engine/*.c gateway/*.c \
	           worker/*.c) $(filter-out cmd/main.c,$(wildcard cmd/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
LIB       := $(BUILD)/libceleriac.a
BIN       := $(BUILD)/celeriac
UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

PY        := /usr/bin/python3

.PHONY: all man install deb test-deb test test-rabbitmq4 unit integration demo bench asan asan-integration valgrind fuzz format check-src \
	    check-src-selftest clean deps services

all: $(BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BIN): $(BUILD)/cmd/main.o $(LIB)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# Every unit-test binary is its test_<module>.c, which defines suite(), linked with the
# one shared main() of tests/unit/main.c and the fake engine_ops of
# tests/unit/fake_engine.c (the engine's tests share it).
UNIT_MAIN := $(BUILD)/tests/unit/main.o
UNIT_FAKE := $(BUILD)/tests/unit/fake_engine.o

$(UNIT_MAIN): tests/unit/main.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CHECK_CFLAGS) -c -o $@ $<

$(UNIT_FAKE): tests/unit/fake_engine.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CHECK_CFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/unit/%.c $(UNIT_MAIN) $(UNIT_FAKE) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CHECK_CFLAGS) -o $@ $< $(UNIT_MAIN) $(UNIT_FAKE) $(LIB) $(LDLIBS) \
	    $(CHECK_LIBS)

# Small programs the integration tests drive (tests/tools/<name>.c, one file each).
TOOL_BIN  := $(patsubst tests/tools/%.c,$(BUILD)/tests/%,$(wildcard tests/tools/*.c))

$(TOOL_BIN): $(BUILD)/tests/%: tests/tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# Man pages, printed by the binary from its option tables (scripts/gen-man.sh).
MAN_STAMP := $(BUILD)/man/.stamp

man: $(MAN_STAMP)

$(MAN_STAMP): $(BIN) scripts/gen-man.sh
	bash scripts/gen-man.sh $(BIN) $(BUILD)/man
	@touch $@

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary, the man pages, the
# systemd unit when the tree has one (its ExecStart pointed at $(PREFIX)/bin),
# and, with PREFIX=/usr, /etc/default/celeriac unless one is there already.
PREFIX    ?= /usr/local
BINDIR    ?= $(PREFIX)/bin
MANDIR    ?= $(PREFIX)/share/man
UNITDIR   ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
UNIT      := $(wildcard packaging/celeriac.service)

install: $(BIN) $(MAN_STAMP)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/celeriac
	install -m 0644 $(BUILD)/man/*.1 $(DESTDIR)$(MANDIR)/man1/
ifneq ($(UNIT),)
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|/usr/bin/celeriac|$(BINDIR)/celeriac|g' $(UNIT) >$(DESTDIR)$(UNITDIR)/celeriac.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/celeriac.service
endif
ifeq ($(PREFIX),/usr)
	install -d $(DESTDIR)$(SYSCONFDIR)/default
	test -e $(DESTDIR)$(SYSCONFDIR)/default/celeriac || \
	    install -m 0640 packaging/celeriac.default $(DESTDIR)$(SYSCONFDIR)/default/celeriac
endif

# A Debian package of the above (PREFIX=/usr, the unit in /lib/systemd/system),
# built with dpkg-deb alone: build/celeriac_<version>_<arch>.deb (scripts/make-deb.sh).
deb: $(BIN) $(MAN_STAMP)
	@bash scripts/make-deb.sh $(BUILD)

# Installs build/*.deb into a fresh Debian 12 root and runs it there
# (scripts/test-deb.sh; needs root; the first run debootstraps a cached root).
test-deb: deb
	@bash scripts/test-deb.sh $(BUILD)

# Installs missing Debian packages (idempotent).
deps:
	@bash scripts/install-deps.sh

unit: $(UNIT_BIN)
	@bash scripts/run-unit.sh $(UNIT_BIN)

integration: $(BIN) $(TOOL_BIN)
	@bash scripts/run-integration.sh

# The integration tests that matter for RabbitMQ 4 against a node configured as
# 4.3 ships (scripts/run-rabbitmq4.sh; needs root, builds its chroot once).
test-rabbitmq4: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/run-rabbitmq4.sh

test: deps
	@$(MAKE) --no-print-directory all $(UNIT_BIN)
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_QUICK_SECONDS)
	@$(MAKE) --no-print-directory integration

demo: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh

# The unit suite under AddressSanitizer, UndefinedBehaviorSanitizer and
# LeakSanitizer (Check runs each test in a child: leaks are reported per test).
# Check's per-test timeouts catch hangs; under the sanitizers a test runs several
# times slower, so they are stretched (CK_TIMEOUT_MULTIPLIER, 3 unless set).
# One process per binary (CK_FORK=no): forked, every test's child ran LeakSanitizer's
# whole-heap scan at its exit, two thirds of the suite's time; in one process the scan
# runs once at the end and still sees every leak. `make unit` keeps a fork per test.
asan:
	@CK_FORK=$${CK_FORK:-no} CK_TIMEOUT_MULTIPLIER=$${CK_TIMEOUT_MULTIPLIER:-3} $(MAKE) --no-print-directory BUILD=build-asan \
	    OPT="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	    build-asan/celeriac unit

# The integration suite against an ASan+UBSan worker binary.
asan-integration:
	@$(MAKE) --no-print-directory BUILD=build-asan \
	    OPT="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	    build-asan/celeriac
	@CELERIAC_BIN=$(CURDIR)/build-asan/celeriac bash scripts/run-integration.sh

# libFuzzer targets (clang): each replays its kept corpus, then runs FUZZ_SECONDS
# on a copy of it, every input bounded in time and memory (scripts/run-fuzz.sh);
# what it finds is written as tests/fuzz/found-<target>-*.
FUZZ_SECONDS ?= 120
FUZZ_QUICK_SECONDS ?= 3
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN  := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
# util/curl_epoll.c drives libcurl, which the fuzz targets do not link.
FUZZ_LIB_SRC := $(filter-out util/curl_epoll.c,$(wildcard util/*.c protocol/*.c llm/policy.c \
                llm/classify.c llm/provider*.c)) gateway/gw_msg.c
FUZZ_COMMON := -g -O1 -D_GNU_SOURCE -fno-sanitize-recover=undefined \
              -I. $(shell pkg-config --cflags libcjson librabbitmq libpcre2-8)
FUZZ_FLAGS := $(FUZZ_COMMON) -fsanitize=fuzzer,address,undefined
# The library is compiled once for all the targets (each target's link used to
# compile all of it again): instrumented as the targets are, without libFuzzer's main.
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=build-fuzz/obj/%.o)

build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_COMMON) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c -o $@ $<

$(FUZZ_BIN): build-fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_OBJ)
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) -MMD -MP -o $@ $< $(FUZZ_LIB_OBJ) \
	    $(shell pkg-config --libs libcjson librabbitmq libpcre2-8) -lz -lm

fuzz: $(FUZZ_BIN)
	@bash scripts/run-fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BIN:=.d)

valgrind: $(UNIT_BIN)
	@for t in $(UNIT_BIN); do CK_FORK=no valgrind -q --leak-check=full --error-exitcode=1 $$t || exit 1; done

format:
	clang-format -i $(wildcard */*.c */*.h tests/*/*.c)

# Banned functions, includes against the layers, clang-format: one line per violation
# (scripts/check-src.sh). The selftest runs the gate on tests/check-src/ fixtures: every
# rule must catch its violation, and a clean tree must pass.
check-src:
	@bash scripts/check-src.sh

check-src-selftest:
	@bash scripts/check-src.sh --selftest

clean:
	rm -rf build build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(BUILD)/cmd/main.d $(UNIT_BIN:=.d) $(TOOL_BIN:=.d) $(UNIT_MAIN:.o=.d) $(UNIT_FAKE:.o=.d)

# Benchmarks (issue 6): bench tools are built on their own, never into $(LIB).
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

$(BUILD)/bench/%: bench/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

.PHONY: bench-tools
bench-tools: $(BENCH_BIN)

# Celeriac against Python Celery on the same machine; BENCH_QUICK=1 for a short run.
bench: deps
	@$(MAKE) --no-print-directory all bench-tools
	@bash scripts/bench.sh

-include $(BENCH_BIN:=.d)

# gateway/gw_page.c embeds the web page with .incbin, which -MMD cannot see.
$(BUILD)/gateway/gw_page.o: gateway/page.html
