# SPDX-License-Identifier: MIT
# infergw - OpenAI-compatible LLM gateway with request coalescing.
#
#   make            build ./infergw and the tools (build/default/bin/);
#                   'make all' and 'make build' are the same
#   make run        install missing Debian packages, build, start the mock
#                   upstream and ./infergw -c etc/gateway.conf
#   make check      install missing Debian packages, then every test
#   make asan       every test under AddressSanitizer + UBSan (build/asan/)
#   make ubsan      every test under UBSan alone (build/ubsan/)
#   make tsan       every test under ThreadSanitizer (build/tsan/)
#   make fuzz       libFuzzer targets with clang (build/fuzz/)
#   make install    binary, gateway.conf (an existing one is kept), man
#                   pages and systemd unit; PREFIX, BINDIR, SYSCONFDIR,
#                   MANDIR, SYSTEMDUNITDIR and DESTDIR honoured
#   make uninstall  the same files; gateway.conf only if unedited
#   make deb        the Debian package infergw_VERSION_ARCH.deb, in DEBDIR
#                   (default .), built in DEBWORK (default build/deb)
#   make bench      the benchmark scripts (docs/BENCHMARKS.md)
#
# Users may override CC, CFLAGS, LDFLAGS, PREFIX, BINDIR, SYSCONFDIR,
# MANDIR and SYSTEMDUNITDIR.  SYSCONFDIR is also compiled in, as the
# default -c path: build with the one you install with (the unit passes -c).
#
# WERROR=1 makes every warning an error in every build (the sanitizer
# variants and fuzz too); CI sets it (.ci/run).  A local build only warns,
# so that a newer compiler's new warning does not stop someone who only
# wants to run the gateway.  Objects are not rebuilt when only WERROR
# changes: use it on a clean tree (make clean), as CI does.

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= $(PREFIX)/etc
DEFAULT_CONF := $(SYSCONFDIR)/infergw/gateway.conf
MANDIR ?= $(PREFIX)/share/man
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
# The unit's @BINDIR@/@SYSCONFDIR@, and the default paths the man pages
# show, become the ones of this install.
INSTALL_SUBST = sed -e 's|@BINDIR@|$(BINDIR)|g' \
    -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
    -e 's|/usr/local/etc/infergw|$(SYSCONFDIR)/infergw|g' \
    -e 's|/usr/local/lib/systemd/system|$(SYSTEMDUNITDIR)|g'
CFLAGS ?= -O2
LDFLAGS ?=
SANITIZE ?=
WERROR ?=

ifeq ($(SANITIZE),)
VARIANT := default
else ifeq ($(SANITIZE),thread)
VARIANT := tsan
else ifeq ($(SANITIZE),undefined)
VARIANT := ubsan
else
VARIANT := asan
endif
BUILD ?= build/$(VARIANT)

BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wformat=2 \
               -g -pthread -MMD -MP -Icommon -Igateway \
               -DINFERGW_DEFAULT_CONF='"$(DEFAULT_CONF)"'
ifeq ($(WERROR),1)
BASE_CFLAGS += -Werror
endif
ifneq ($(SANITIZE),)
BASE_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer \
               -fno-sanitize-recover=all
SAN_LDFLAGS := -fsanitize=$(SANITIZE)
endif

PKG_CFLAGS := $(shell pkg-config --cflags libcurl jansson hiredis 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs libcurl jansson hiredis 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
# Debian's mbedTLS 2.28 ships no .pc file.
MBEDTLS_LIBS ?= -lmbedtls -lmbedx509 -lmbedcrypto
# libcurl's TLS backend, asked one thing directly
# (upstream_session_tls_leftover()): whether it holds bytes nobody read;
# and its SHA-256, the coalescing key's (coalesce.c says why).
OPENSSL_LIBS := $(shell pkg-config --libs libssl libcrypto 2>/dev/null \
                  || echo -lssl -lcrypto)

ALL_CFLAGS = $(BASE_CFLAGS) $(PKG_CFLAGS) $(CFLAGS)
ALL_LDFLAGS = -pthread $(SAN_LDFLAGS) $(LDFLAGS)

COMMON_SRC := $(sort $(wildcard common/*.c))
# gateway/main.c, and a folder per layer (docs/ARCHITECTURE.md).
GATEWAY_SRC := $(sort $(wildcard gateway/*.c gateway/*/*.c))
GATEWAY_LIB_SRC := $(filter-out gateway/main.c,$(GATEWAY_SRC))
TOOL_SRC := $(sort $(wildcard tools/*.c))
UNIT_SRC := $(sort $(wildcard test/unit/check_*.c))

COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
GATEWAY_OBJ := $(GATEWAY_SRC:%.c=$(BUILD)/%.o)
# Unit tests link objects built with -DINFERGW_UNIT_TEST (GW_TESTABLE).
UT_OBJ := $(COMMON_SRC:%.c=$(BUILD)/ut/%.o) $(GATEWAY_LIB_SRC:%.c=$(BUILD)/ut/%.o)
TOOLS := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
UNITS := $(UNIT_SRC:test/unit/%.c=$(BUILD)/test/%)
LIB := $(BUILD)/libinfergw.a

.PHONY: all build deps run check unit integration asan ubsan tsan fuzz \
        install uninstall deb clean format bench

all: $(BUILD)/bin/infergw $(TOOLS)
# What newcomers type first; build/ itself is only where objects go.
build: all
ifeq ($(VARIANT),default)
all: infergw
infergw: $(BUILD)/bin/infergw
	cp $< $@
endif

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# The default config path is compiled into main.c, so a SYSCONFDIR (or
# PREFIX) other than the last build's rebuilds it: the stamp holds the
# path and is rewritten only when it differs.
PATHS_STAMP := $(BUILD)/paths.stamp
$(PATHS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(DEFAULT_CONF)' | cmp -s - $@ || echo '$(DEFAULT_CONF)' > $@
$(BUILD)/gateway/main.o $(BUILD)/ut/gateway/main.o: $(PATHS_STAMP)
.PHONY: FORCE
FORCE:

$(BUILD)/ut/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DINFERGW_UNIT_TEST -c $< -o $@

$(LIB): $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/bin/infergw: $(GATEWAY_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(GATEWAY_OBJ) $(LIB) $(PKG_LIBS) \
	    $(MBEDTLS_LIBS) $(OPENSSL_LIBS)

# tools/ link common/ only.
$(BUILD)/bin/%: $(BUILD)/tools/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $< $(LIB) $(PKG_LIBS) $(MBEDTLS_LIBS)

# A tool in several files keeps its pieces in a folder of its name:
# every tools/*.c is a program of its own, so a helper file there would
# be built as one.
MOCK_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/mock/*.c)))
$(BUILD)/bin/mock_upstream: $(BUILD)/tools/mock_upstream.o $(MOCK_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(PKG_LIBS) \
	    $(MBEDTLS_LIBS)

LOADGEN_OBJ := $(patsubst %.c,$(BUILD)/%.o,\
               $(sort $(wildcard tools/loadgen/*.c)))
$(BUILD)/bin/loadgen: $(BUILD)/tools/loadgen.o $(LOADGEN_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(PKG_LIBS) \
	    $(MBEDTLS_LIBS)

$(BUILD)/test/check_%: test/unit/check_%.c $(UT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DINFERGW_UNIT_TEST -o $@ $< \
	    $(UT_OBJ) $(ALL_LDFLAGS) $(CHECK_LIBS) $(PKG_LIBS) $(MBEDTLS_LIBS) $(OPENSSL_LIBS)

# check_proxy drives the three paths over a scripted upstream of its own:
# it links every gateway object but upstream.o (curl's test stubs' way)
# and upstream_testcall.o, which drives upstream.o's callbacks,
# generation.o, the one other module that makes upstreams (stubbed there
# too), and server.o, which needs generation.o.
PROXY_UT_OBJ := $(filter-out $(BUILD)/ut/gateway/upstream/upstream.o \
                  $(BUILD)/ut/gateway/upstream/upstream_testcall.o \
                  $(BUILD)/ut/gateway/client/generation.o \
                  $(BUILD)/ut/gateway/client/server.o, $(UT_OBJ))
$(BUILD)/test/check_proxy: test/unit/check_proxy.c $(PROXY_UT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DINFERGW_UNIT_TEST -o $@ $< \
	    $(PROXY_UT_OBJ) $(ALL_LDFLAGS) $(CHECK_LIBS) $(PKG_LIBS) \
	    $(MBEDTLS_LIBS) $(OPENSSL_LIBS)

# check_route answers requests with reply.c, proxy.c and the pool stubbed:
# it defines the functions route.c calls in them, and takes every other
# object from an archive, from which the linker pulls only the members
# that define a symbol still missing, so reply.o, proxy.o and the pool's
# objects those functions are in are never linked (a stub that no longer
# matches its header fails to compile; a function the test forgot pulls
# the real object in and fails to link, as a duplicate).
UT_LIB := $(BUILD)/ut/libinfergw_ut.a
$(UT_LIB): $(UT_OBJ)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/test/check_route: test/unit/check_route.c $(UT_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DINFERGW_UNIT_TEST -o $@ $< \
	    $(UT_LIB) $(ALL_LDFLAGS) $(CHECK_LIBS) $(PKG_LIBS) $(MBEDTLS_LIBS) \
	    $(OPENSSL_LIBS)

# check_dispatch runs dispatch.c over a scripted upstream_perform() of its
# own, the same way: upstream.o is never pulled from the archive.
$(BUILD)/test/check_dispatch: test/unit/check_dispatch.c $(UT_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DINFERGW_UNIT_TEST -o $@ $< \
	    $(UT_LIB) $(ALL_LDFLAGS) $(CHECK_LIBS) $(PKG_LIBS) $(MBEDTLS_LIBS) \
	    $(OPENSSL_LIBS)

# Fuzz targets: test/fuzz/fuzz_NAME.c, seeded from test/fuzz/corpus/NAME/.
# Each is also built with $(CC) and a small corpus-replay main() instead
# of libFuzzer (replay.c), linked with the -DINFERGW_UNIT_TEST objects as
# the unit tests are, so that 'make unit' runs every corpus file through
# its target under this variant's sanitizers.
FUZZ_SRC := $(sort $(wildcard test/fuzz/fuzz_*.c))
FUZZ_NAMES := $(FUZZ_SRC:test/fuzz/fuzz_%.c=%)
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(BUILD)/test/fuzz_%_replay)
$(BUILD)/test/fuzz_%_replay: test/fuzz/fuzz_%.c test/fuzz/replay.c $(UT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DINFERGW_UNIT_TEST -o $@ $< test/fuzz/replay.c \
	    $(UT_OBJ) $(ALL_LDFLAGS) $(PKG_LIBS) $(MBEDTLS_LIBS) $(OPENSSL_LIBS)

# Fresh-machine set-up: installs missing Debian packages (or says how).
deps:
	@sh tools/install-deps.sh

# check_exports reads the plain build's objects (not the unit tests',
# built with -DINFERGW_UNIT_TEST), so unit builds them too.
unit: $(UNITS) $(FUZZ_REPLAY) $(BUILD)/bin/infergw $(TOOLS)
	@python3 test/check_includes.py
	@python3 test/check_sizes.py
	@python3 test/check_exports.py $(BUILD)
	@python3 test/check_licence.py
	@python3 test/check_docs.py
	@python3 test/integration/run_selftest.py
	@sh test/unit/run.sh $(UNITS)
	@for n in $(FUZZ_NAMES); do \
	    $(BUILD)/test/fuzz_$${n}_replay test/fuzz/corpus/$$n || exit 1; \
	done

integration: all
	@python3 test/integration/run.py --bin $(BUILD)/bin

# make check runs the install step first, so a test that skips for want
# of a program that step installs (haproxy, curl, mandoc) did not run for
# a reason that must be fixed: INFERGW_TEST_NO_SKIP=1 makes it a failure
# (run.py).  'make integration' alone lets it skip.
check: deps
	@$(MAKE) --no-print-directory unit
	@INFERGW_TEST_NO_SKIP=1 $(MAKE) --no-print-directory integration

asan:
	@$(MAKE) --no-print-directory check SANITIZE=address,undefined
ubsan:
	@$(MAKE) --no-print-directory check SANITIZE=undefined
tsan:
	@$(MAKE) --no-print-directory check SANITIZE=thread

# make run [PORT=N UPSTREAM_PORT=N ADMIN_PORT=N] [CONF=FILE] (tools/run.sh)
run: deps
	@$(MAKE) --no-print-directory all
	@BIN=$(BUILD)/bin CONF='$(CONF)' PORT='$(PORT)' \
	    UPSTREAM_PORT='$(UPSTREAM_PORT)' ADMIN_PORT='$(ADMIN_PORT)' \
	    sh tools/run.sh

# Benchmarks behind docs/BENCHMARKS.md (not tests: they report numbers).
bench: deps
	@$(MAKE) --no-print-directory all
	@BIN=$(BUILD)/bin sh tools/bench_proxy.sh
	@BUILD=$(BUILD) sh tools/bench_coalesce.sh
	@python3 tools/bench_flight_memory.py --bin $(BUILD)/bin
	@BIN=$(BUILD)/bin sh tools/bench_pool.sh
	@BIN=$(BUILD)/bin sh tools/bench_stream_cost.sh
	@BIN=$(BUILD)/bin sh tools/bench_cache.sh
	@python3 tools/bench_scaleout.py --bin $(BUILD)/bin
	@python3 tools/bench_sched.py --quick --bin $(BUILD)/bin
	@python3 tools/bench_cluster.py --bin $(BUILD)/bin

# libFuzzer with clang, under ASan and UBSan, in build/fuzz/: builds every
# target, then runs each for FUZZ_TIME seconds (0: build only).  libFuzzer
# writes the inputs it finds to the first corpus directory it is given,
# build/fuzz/corpus/NAME/ (kept, so the next run goes on from there), and
# only reads the seeds in test/fuzz/corpus/NAME/.  A failing input is saved
# as build/fuzz/crash/NAME-{crash,leak,timeout}-<sha1> and the run fails
# with its report; the whole log of each run is build/fuzz/NAME.log.
# Reproduce with build/fuzz/fuzz_NAME FILE, and keep the input in the
# seeds as a regression.
FUZZ_TIME ?= 60
FUZZ_CC ?= clang
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -DINFERGW_UNIT_TEST -g -O1 \
               -Wall -Wextra -Wshadow -Wformat=2 -pthread -MMD -MP \
               -Icommon -Igateway -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=all
ifeq ($(WERROR),1)
FUZZ_CFLAGS += -Werror
endif
FUZZ_OBJ := $(UT_OBJ:$(BUILD)/ut/%=build/fuzz/obj/%)
FUZZ_BINS := $(FUZZ_NAMES:%=build/fuzz/fuzz_%)

# The gateway's objects get libFuzzer's coverage instrumentation too.
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) \
	    -c $< -o $@

build/fuzz/fuzz_%: test/fuzz/fuzz_%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) -o $@ $< \
	    $(FUZZ_OBJ) $(PKG_LIBS) $(MBEDTLS_LIBS) $(OPENSSL_LIBS)

fuzz:
	@sh tools/install-deps.sh clang libclang-rt-dev
	@$(MAKE) --no-print-directory $(FUZZ_BINS)
	@[ "$(FUZZ_TIME)" -gt 0 ] || exit 0; \
	for n in $(FUZZ_NAMES); do \
	    mkdir -p build/fuzz/corpus/$$n build/fuzz/crash; \
	    echo "fuzz: $$n for $(FUZZ_TIME)s"; \
	    if ! build/fuzz/fuzz_$$n -max_total_time=$(FUZZ_TIME) -timeout=10 \
	        -print_final_stats=1 -artifact_prefix=build/fuzz/crash/$$n- \
	        build/fuzz/corpus/$$n test/fuzz/corpus/$$n \
	        >build/fuzz/$$n.log 2>&1; then \
	        tail -n 60 build/fuzz/$$n.log; exit 1; \
	    fi; \
	    grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of|average|new)' \
	        build/fuzz/$$n.log; \
	done

-include $(shell find build/fuzz -name '*.d' 2>/dev/null)

# Only the gateway is installed, so only it is built (not the tools, nor
# the ./infergw copy).  An operator's gateway.conf is never overwritten,
# and uninstall removes it only while it is still the sample.
install: $(BUILD)/bin/infergw
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SYSCONFDIR)/infergw \
	    $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
	    $(DESTDIR)$(SYSTEMDUNITDIR)
	install -m 755 $(BUILD)/bin/infergw $(DESTDIR)$(BINDIR)/infergw
	@conf=$(DESTDIR)$(SYSCONFDIR)/infergw/gateway.conf; \
	if [ -e "$$conf" ]; then \
	    echo "kept the existing $$conf"; \
	else \
	    echo "install -m 644 etc/gateway.conf $$conf"; \
	    install -m 644 etc/gateway.conf "$$conf"; \
	fi
	$(INSTALL_SUBST) man/infergw.8 > $(DESTDIR)$(MANDIR)/man8/infergw.8
	$(INSTALL_SUBST) man/gateway.conf.5 \
	    > $(DESTDIR)$(MANDIR)/man5/gateway.conf.5
	$(INSTALL_SUBST) etc/infergw.service.in \
	    > $(DESTDIR)$(SYSTEMDUNITDIR)/infergw.service
	chmod 644 $(DESTDIR)$(MANDIR)/man8/infergw.8 \
	    $(DESTDIR)$(MANDIR)/man5/gateway.conf.5 \
	    $(DESTDIR)$(SYSTEMDUNITDIR)/infergw.service

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/infergw \
	    $(DESTDIR)$(MANDIR)/man8/infergw.8 \
	    $(DESTDIR)$(MANDIR)/man5/gateway.conf.5 \
	    $(DESTDIR)$(SYSTEMDUNITDIR)/infergw.service
	@conf=$(DESTDIR)$(SYSCONFDIR)/infergw/gateway.conf; \
	if [ ! -e "$$conf" ]; then \
	    :; \
	elif cmp -s etc/gateway.conf "$$conf"; then \
	    echo "rm -f $$conf"; \
	    rm -f "$$conf"; \
	    rmdir "$${conf%/*}" 2>/dev/null || true; \
	else \
	    echo "kept $$conf: it differs from etc/gateway.conf"; \
	fi

# tools/deb/build.sh builds the gateway afresh in DEBWORK with Debian's
# flags and paths, stages it with 'make install' and packs it with
# dpkg-deb.  MAKE is passed so that its make shares this one's jobs.
DEBDIR ?= .
DEBWORK ?= build/deb
deb: deps
	@MAKE='$(MAKE)' sh tools/deb/build.sh '$(DEBDIR)' '$(DEBWORK)'

format:
	clang-format -i common/*.[ch] gateway/*.[ch] gateway/*/*.[ch] tools/*.c \
	    tools/mock/*.[ch] tools/loadgen/*.[ch] test/unit/*.c

clean:
	rm -rf build infergw

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
