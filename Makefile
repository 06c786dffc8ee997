# vunet — vhost-user network back-end.
# `make demo` and `make test` are the two commands a new user needs (README.md).

GO        ?= go
BIN       ?= bin/vunet
SOCKET    ?= /tmp/vunet.sock
METRICS   ?= 127.0.0.1:9595
FUZZTIME  ?= 60s
STATICCHECK_VERSION ?= v0.8.2
# Packages whose tests need no root, QEMU or network namespaces; they also run
# under the race detector.
UNIT_PKGS = ./virtqueue/... ./vhostuser/... ./tcpstack/... ./metrics/... ./cmd/... ./test/frontend/...

.PHONY: all build run demo test test-unit test-system bench fuzz lint clean setup-demo setup-test man completion soak

all: build

# The build says what it is (vunet --version, vunet_build_info): a release
# tag when HEAD has one, and the commit (+dirty: uncommitted changes). Go
# stamps these itself in a plain clone, but not in a git worktree or with
# -buildvcs=false; these flags work everywhere.
VERSION  ?= $(shell git describe --tags --exact-match --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo +dirty)
LDFLAGS  ?= $(if $(VERSION),-X main.version=$(VERSION)) $(if $(REVISION:+dirty=),-X main.revision=$(REVISION))

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/vunet
	$(GO) build -o $(dir $(BIN))vunet-repair ./cmd/vunet-repair

run: build
	$(BIN) --socket $(SOCKET) --metrics $(METRICS) --print-qemu-args

# Builds vunet and a tiny guest, boots it under QEMU on vunet, and shows it
# getting an address by DHCP and fetching a page from this host's loopback;
# prints vunet's counters and cleans up (test/demo; needs QEMU, no root).
demo: setup-demo
	$(GO) run ./test/demo

# The prerequisites, checked up front (Go first, then Debian packages): as
# root the missing packages are installed, otherwise the one apt-get line
# to run is printed and make stops (test/setup/setup.sh).
setup-demo:
	@GO=$(GO) test/setup/setup.sh demo

setup-test:
	@GO=$(GO) test/setup/setup.sh test

test: setup-test
	@$(MAKE) --no-print-directory test-unit test-system

# The second run injects host errors into the data path's system calls
# (a test-only build, tag vunetfault; production code has no such hook).
test-unit:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m $(UNIT_PKGS)
	$(GO) test -race -count=1 -tags vunetfault -run Fault ./tcpstack/...

# Real front-ends and hostile inputs: in-process hostile front-end, QEMU guest,
# DPDK testpmd. These need root; in CI (CI=true) a missing tool is a failure.
test-system:
	$(GO) test -count=1 -timeout 25m -p 1 ./test/...

# A long run on the netns/TAP rig (root; iproute2, busybox): byte streams
# both ways, connection churn, UDP echo, a burst of every guest flood and a
# front-end reconnect each minute, with vunet's RSS, descriptors and
# goroutines printed per minute; fails on a transfer that is not
# byte-exact, a stall, or a sample after minute 5 more than 10% from
# minute 5's. SOAK_FLAGS passes options (go run ./test/soak -h), e.g.
# SOAK_FLAGS='-minutes 10'. Not part of `make test`: it takes 30 minutes.
SOAK_FLAGS ?=
soak:
	$(GO) run ./test/soak $(SOAK_FLAGS)

# The benchmark suite on the netns/TAP rig (root, iproute2, iperf3): vunet
# next to the kernel's own ceiling (a veth pair) and, when
# VUNET_BENCH_PEER='CMD ... {socket} ...' is set, next to that back-end
# (VUNET_BENCH_PEER_TESTPMD: its command for the testpmd rows); then
# the hot-path micro-benchmarks. Table on stdout, JSON in $(BENCH_OUT);
# BENCH_FLAGS passes options (go run ./test/bench -h), e.g. BENCH_FLAGS='-t 5'.
BENCH_OUT   ?= bench-results.json
BENCH_FLAGS ?=
bench:
	$(GO) run ./test/bench -out $(BENCH_OUT) $(BENCH_FLAGS)

# The Go micro-benchmarks alone (no root): allocs/op of the hot paths.
.PHONY: bench-micro
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./virtqueue/... ./vhostuser/... ./tcpstack/...

# Runs every fuzz target for $(FUZZTIME) each; the seed corpora live in each
# package's testdata/fuzz directory.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# The manual page and the shell completions, generated from the flag
# definitions (`vunet man`, `vunet completion bash|zsh`): man ./vunet.1.
man:
	$(GO) run ./cmd/vunet man > vunet.1

completion:
	mkdir -p bin/completion
	$(GO) run ./cmd/vunet completion bash > bin/completion/vunet
	$(GO) run ./cmd/vunet completion zsh > bin/completion/_vunet

clean:
	rm -rf bin vunet.1
