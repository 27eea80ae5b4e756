# gpu-device-plugin. `make test` is what CI runs; `make demo` shows the plugin
# at work on a machine without a GPU.

GO      ?= go
BIN     ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# go-nvml's generated cgo code trips gcc's deprecation warnings by the
# hundred; they say nothing about our code.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build test unit conformance vet bench demo clean

all: build

build: $(BIN)/gpu-device-plugin

$(BIN)/gpu-device-plugin: FORCE
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin

FORCE:

vet:
	$(GO) vet ./...
	cd e2e && $(GO) vet ./...

unit:
	$(GO) test -race -count=1 ./...

# The kubelet's own device-manager code against our plugin, in-process.
conformance:
	cd e2e && $(GO) test -race -count=1 ./...

test: vet unit conformance

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: e2e bench-scenario

# The real binary against the kubelet's own device-plugin code on every
# mock machine profile (conformance runs it too, with the rest of e2e).
e2e:
	cd e2e && $(GO) test -race -count=1 ./wholebinary/

# The whole binary's figures as one JSON report per profile: start-up to
# registration, Allocate and GetPreferredAllocation p50/p99, XID detection,
# re-registration after kubelet restarts, peak RSS and CPU after idling.
SCENARIO_IDLE ?= 30s
bench: bench-scenario
bench-scenario:
	cd e2e && $(GO) run ./cmd/scenario -profile dgx-h100 -idle $(SCENARIO_IDLE)
	cd e2e && $(GO) run ./cmd/scenario -profile hgx-16 -idle $(SCENARIO_IDLE)

demo:
	cd e2e && $(GO) run ./cmd/demo

clean:
	rm -rf $(BIN)
