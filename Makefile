# gpu-device-plugin. `make test` is what CI runs; `make demo` shows the plugin
# at work on a machine without a GPU.

GO      ?= go
BIN     ?= bin
# The release version, semver, is the VERSION file's: the one place it is
# written. A build of the commit tagged with it, from a clean tree, is that
# version; any other build of a git checkout adds the commit as semver build
# metadata, v0.1.0+4c3f594 or v0.1.0+4c3f594.dirty (built on v0.1.0, not
# v0.1.0 itself). A tree without git (a source archive) is the version it
# names. VERSION=... on the command line overrides it; `make version`
# prints it. docs/development.md, Releases.
RELEASE := $(shell cat VERSION)
ifeq ($(origin VERSION),undefined)
VERSION := $(shell \
	c=$$(git rev-parse --short HEAD 2>/dev/null) || { echo '$(RELEASE)'; exit 0; }; \
	d=$$(git diff --quiet HEAD -- 2>/dev/null || echo .dirty); \
	if [ -z "$$d" ] && git tag --points-at HEAD | grep -qFx '$(RELEASE)'; then echo '$(RELEASE)'; \
	else echo '$(RELEASE)+'"$$c$$d"; fi)
endif
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# go-nvml's generated cgo code trips gcc's deprecation warnings by the
# hundred; they say nothing about our code.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build test unit conformance vet bench demo clean version

all: build

version:
	@echo '$(VERSION)'

build: $(BIN)/gpu-device-plugin $(BIN)/gpu-device-plugin-dp $(BIN)/gpu-device-plugin-dra $(BIN)/gpu-device-plugin-controller $(BIN)/gpu-device-plugin-cdi-hook

# Build tags that leave out what the plugin never runs, since on Linux the
# whole executable is resident (docs/architecture.md): urfave/cli's man-page
# and Markdown writers, and grpc-go's HTML request tracing (DRA mode).
GOTAGS = urfave_cli_no_docs,grpcnotrace

$(BIN)/gpu-device-plugin: FORCE
	$(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '$(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin

# The daemons: serve execs gpu-device-plugin-dp (device-plugin mode) or
# gpu-device-plugin-dra (kubeletAPI: dra) from its own directory, so they
# ship beside gpu-device-plugin, which keeps the CLI out of the daemon's
# memory (docs/architecture.md). Built the same way (cgo, for NVML), but
# without DWARF (-s -w; stack traces keep their names), which the image
# would carry for nothing.
$(BIN)/gpu-device-plugin-dp: FORCE
	$(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin-dp

$(BIN)/gpu-device-plugin-dra: FORCE
	$(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin-dra

# The ComputeDomain controller, the chart's one Deployment for the cluster,
# a program of its own so that the node's daemons link no informers or
# leader election; gpu-device-plugin-dra compute-domain-controller, which
# charts of earlier releases run, execs it from beside itself. Built as
# the daemons are.
$(BIN)/gpu-device-plugin-controller: FORCE
	$(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin-controller

# The CDI hook is static (no cgo): the container runtime runs it on the
# host for every GPU container, whatever libc the host has, and the chart's
# init container copies it there out of the image.
$(BIN)/gpu-device-plugin-cdi-hook: FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/gpu-device-plugin-cdi-hook

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

.PHONY: e2e bench-scenario gfd-compare

# The real binary against the kubelet's own device-plugin code on every
# mock machine profile (conformance runs it too, with the rest of e2e).
e2e:
	cd e2e && $(GO) test -race -count=1 ./wholebinary/

# Our node labels against NVIDIA's GPU Feature Discovery on the same mock
# nodes (docs/node-labels.md): builds gpu-feature-discovery from its module
# once into e2e/cluster/.cache (E2E_CLUSTER_CACHE), then fails on any label
# both set that differs. Needs root (GFD gets the mock sysfs as /sys in a
# mount namespace of its own). Not part of test.
gfd-compare:
	cd e2e && $(GO) test -tags gfdcompare -count=1 -v ./gfdcompare/

# The whole binary's figures as one JSON report per profile: start-up to
# registration, Allocate and GetPreferredAllocation p50/p99, XID detection,
# re-registration after kubelet restarts, peak RSS and CPU after idling.
SCENARIO_IDLE ?= 30s
bench: bench-scenario
bench-scenario:
	cd e2e && $(GO) run ./cmd/scenario -profile dgx-h100 -idle $(SCENARIO_IDLE)
	cd e2e && $(GO) run ./cmd/scenario -profile hgx-16 -idle $(SCENARIO_IDLE)

# The first run downloads the modules the kubelet's device-manager code
# needs (about 1,250 packages) and compiles them: several minutes on 2
# cores. Later runs take seconds. Each step prints a line.
demo:
	@mkdir -p $(BIN)
	@echo "demo: compiling the demo with the kubelet's device-manager code (first run: downloads and builds its modules, several minutes) ..."
	@cd e2e && $(GO) build -o $(abspath $(BIN))/demo ./cmd/demo
	@$(BIN)/demo

# A first look in under two minutes on a fresh clone, without the kubelet's
# code: builds only the plugin, the mock NVML library and first-look, then
# shows list, allocate, serve's Allocate answer and an XID taking a GPU
# out, on a mock 8-GPU node in a temporary folder (e2e/cmd/firstlook).
.PHONY: first-look
first-look:
	@GO='$(GO)' BIN='$(BIN)' e2e/cmd/firstlook/run.sh

# What the plugin does on one GPU node, in a few minutes, as one report
# (docs/gpu-check.md): on this machine's GPUs when it has the NVIDIA driver,
# else on a mock node. gpu-check-bundle builds bin/gpu-check, the folder a
# GPU node without Go runs it from (GPU_CHECK_BUILD=no make gpu-check).
.PHONY: gpu-check gpu-check-bundle
gpu-check:
	e2e/cmd/gpucheck/run.sh

gpu-check-bundle:
	e2e/cmd/gpucheck/bundle.sh $(BIN)/gpu-check

clean:
	rm -rf $(BIN)

# Shipping: the container image, the node OS packages and releases. The
# build tools are a module of their own (tools/), so the product's go.mod
# stays lean; `go run` fetches their dependencies through the Go module proxy.
#   make image [BASE=base.tar|oci-dir] [PCI_IDS=/path/pci.ids|none]  → $(BIN)/gpu-device-plugin-image.tar
#   make push IMAGE=registry/name:tag                                  → that tarball, pushed there
#   make packages                                                      → $(BIN)/*.deb, $(BIN)/*.rpm
#   make release VERSION=v0.1.0   → $(BIN)/release/v0.1.0/, every part for linux/amd64 and linux/arm64
#   make push VERSION=v0.1.0 IMAGE=registry/name [CHARTS=registry/charts]
#                                 → that release: its image index and its chart
# All carry the plugin, its daemons beside it (gpu-device-plugin-dp and
# gpu-device-plugin-dra, which serve execs), the ComputeDomain controller
# (gpu-device-plugin-controller) and its CDI hook (gpu-device-plugin-cdi-hook).
# All stamp VERSION and COMMIT, and take file times from the last commit
# (SOURCE_DATE_EPOCH), so the same commit gives the same image digest.
.PHONY: image push packages tools-test deploy-test release release-preflight release-verify

LICENSE           ?= Apache-2.0
IMAGE_REPO        ?= ghcr.io/gpu-device-plugin/gpu-device-plugin
BASE              ?=
PCI_IDS           ?=
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image: $(BIN)/gpu-device-plugin $(BIN)/gpu-device-plugin-dp $(BIN)/gpu-device-plugin-dra $(BIN)/gpu-device-plugin-controller $(BIN)/gpu-device-plugin-cdi-hook
	cd tools && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run ./imagebuild \
		-binary $(abspath $(BIN))/gpu-device-plugin \
		-dp $(abspath $(BIN))/gpu-device-plugin-dp \
		-dra $(abspath $(BIN))/gpu-device-plugin-dra \
		-controller $(abspath $(BIN))/gpu-device-plugin-controller \
		-hook $(abspath $(BIN))/gpu-device-plugin-cdi-hook \
		-version '$(VERSION)' -commit '$(COMMIT)' -license '$(LICENSE)' -repository '$(IMAGE_REPO)' \
		$(if $(BASE),-base $(abspath $(BASE))) \
		$(if $(filter none,$(PCI_IDS)),-pci-ids none,$(if $(PCI_IDS),-pci-ids $(abspath $(PCI_IDS)))) \
		-o $(abspath $(BIN))/gpu-device-plugin-image.tar

# Pushes what was built before (it does not rebuild: what is pushed is
# what was tested), with docker login's credentials and the proxy
# environment, without a container engine. IMAGE decides what:
#   registry/name:tag  the one-platform tarball `make image` last wrote, to that tag;
#   registry/name      the release folder `make release` wrote for VERSION, checked
#                      again: its image index (every platform) as registry/name:<VERSION's tag>
#                      and its chart as $(CHARTS)/gpu-device-plugin:<chart version>, which
#                      helm pull oci://$(CHARTS)/gpu-device-plugin --version <chart version> reads.
# CHARTS defaults to IMAGE's parent + /charts. No image is published yet:
# the chart and manifests need one you pushed.
IMAGE  ?=
CHARTS ?= $(patsubst %/,%,$(dir $(IMAGE)))/charts
push:
	@test -n '$(IMAGE)' || { echo 'make push: set IMAGE=registry/name to push the release (make release VERSION=...), or IMAGE=registry/name:tag to push make image'"'"'s tarball' >&2; exit 2; }
	$(if $(findstring :,$(notdir $(IMAGE))),$(PUSH_IMAGE),$(PUSH_RELEASE))

PUSH_IMAGE   = cd tools && $(GO) run ./imagebuild push -tarball $(abspath $(BIN))/gpu-device-plugin-image.tar -image '$(IMAGE)'
PUSH_RELEASE = cd tools && $(GO) run ./releasebuild push -version '$(VERSION)' -dir $(abspath $(RELEASE_DIR)) \
		-platforms '$(RELEASE_PLATFORMS)' -image '$(IMAGE)' -charts '$(CHARTS)'

packages: $(BIN)/gpu-device-plugin $(BIN)/gpu-device-plugin-dp $(BIN)/gpu-device-plugin-dra $(BIN)/gpu-device-plugin-controller $(BIN)/gpu-device-plugin-cdi-hook
	cd tools && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run ./pkgbuild \
		-root .. -config ../packaging/nfpm.yaml \
		-binary $(abspath $(BIN))/gpu-device-plugin \
		-dp $(abspath $(BIN))/gpu-device-plugin-dp \
		-dra $(abspath $(BIN))/gpu-device-plugin-dra \
		-controller $(abspath $(BIN))/gpu-device-plugin-controller \
		-hook $(abspath $(BIN))/gpu-device-plugin-cdi-hook \
		-version '$(VERSION)' -license '$(LICENSE)' -o $(abspath $(BIN))

# A release, into one folder, $(BIN)/release/$(VERSION)/ (docs/development.md,
# Releases): the image for every architecture of RELEASE_ARCHES as one OCI
# image index (an OCI layout tarball), the chart (version and appVersion
# set from VERSION), a .deb and an .rpm per architecture, the static CDI
# hook per architecture, a CycloneDX SBOM of every binary, and SHA256SUMS.
# releasebuild checks the folder at the end (make release-verify does it
# again): every part says VERSION and every file matches its sum.
# An architecture other than the build machine's is built with Debian's
# C cross compiler (cgo, for NVML) and its image takes glibc from that
# cross libc's sysroot; make refuses to start without them.
RELEASE_ARCHES    ?= amd64 arm64
RELEASE_DIR        = $(BIN)/release/$(VERSION)
RELEASE_WORK       = $(BIN)/release-work/$(VERSION)
RELEASE_TOOLS      = $(BIN)/release-work/tools
release_comma     := ,
release_space     := $() $()
RELEASE_PLATFORMS  = $(subst $(release_space),$(release_comma),$(addprefix linux/,$(strip $(RELEASE_ARCHES))))
GOHOSTARCH        ?= $(shell $(GO) env GOHOSTARCH)
CROSS_CC_arm64      ?= aarch64-linux-gnu-gcc
CROSS_SYSROOT_arm64 ?= /usr/aarch64-linux-gnu
CROSS_PKGS_arm64    := gcc-aarch64-linux-gnu libc6-dev-arm64-cross
CROSS_CC_amd64      ?= x86_64-linux-gnu-gcc
CROSS_SYSROOT_amd64 ?= /usr/x86_64-linux-gnu
CROSS_PKGS_amd64    := gcc-x86-64-linux-gnu libc6-dev-amd64-cross
release_cross       = $(filter-out $(GOHOSTARCH),$(1))
release_cgo         = CGO_ENABLED=1 GOOS=linux GOARCH=$(1)$(if $(call release_cross,$(1)), CC=$(CROSS_CC_$(1)))
release_sysroot     = $(if $(call release_cross,$(1)),$(CROSS_SYSROOT_$(1)),/)
release_missing     = $(if $(and $(shell command -v $(CROSS_CC_$(1))),$(wildcard $(CROSS_SYSROOT_$(1))/lib/libc.so)),,$(1))

release: release-preflight $(addprefix release-linux-,$(RELEASE_ARCHES))
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(RELEASE_TOOLS)/releasebuild assemble -version '$(VERSION)' \
		-dir $(abspath $(RELEASE_DIR)) -work $(abspath $(RELEASE_WORK)) -platforms '$(RELEASE_PLATFORMS)' \
		-chart $(abspath deploy/helm/gpu-device-plugin) -repository '$(IMAGE_REPO)'

# Says in one line what is missing before minutes of building; then
# empties the folder and builds the tools once.
release-preflight:
	$(if $(filter v%,$(VERSION)),,$(error make release: VERSION=$(VERSION) is not v and a semantic version; try make release VERSION=v0.1.0))
	$(foreach a,$(RELEASE_ARCHES),$(if $(call release_cross,$(a)),$(if $(call release_missing,$(a)),$(error make release: linux/$(a) needs the C cross compiler $(CROSS_CC_$(a)) and its libc in $(CROSS_SYSROOT_$(a)) (cgo, for NVML): apt-get install $(CROSS_PKGS_$(a))))))
	rm -rf '$(RELEASE_DIR)' '$(RELEASE_WORK)'
	mkdir -p '$(RELEASE_DIR)' '$(RELEASE_WORK)'
	cd tools && $(GO) build -o $(abspath $(RELEASE_TOOLS))/ ./imagebuild ./pkgbuild ./releasebuild

# One architecture: its five binaries (built as make build builds them),
# its image (from scratch and that architecture's glibc) and its packages.
release-linux-%: release-preflight
	$(call release_cgo,$*) $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '$(LDFLAGS)' -o $(RELEASE_WORK)/linux-$*/gpu-device-plugin ./cmd/gpu-device-plugin
	$(call release_cgo,$*) $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dp ./cmd/gpu-device-plugin-dp
	$(call release_cgo,$*) $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dra ./cmd/gpu-device-plugin-dra
	$(call release_cgo,$*) $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '-s -w $(LDFLAGS)' -o $(RELEASE_WORK)/linux-$*/gpu-device-plugin-controller ./cmd/gpu-device-plugin-controller
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_WORK)/linux-$*/gpu-device-plugin-cdi-hook ./cmd/gpu-device-plugin-cdi-hook
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(RELEASE_TOOLS)/imagebuild -sysroot $(call release_sysroot,$*) \
		-binary $(RELEASE_WORK)/linux-$*/gpu-device-plugin \
		-dp $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dp \
		-dra $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dra \
		-controller $(RELEASE_WORK)/linux-$*/gpu-device-plugin-controller \
		-hook $(RELEASE_WORK)/linux-$*/gpu-device-plugin-cdi-hook \
		-version '$(VERSION)' -commit '$(COMMIT)' -license '$(LICENSE)' -repository '$(IMAGE_REPO)' \
		$(if $(filter none,$(PCI_IDS)),-pci-ids none,$(if $(PCI_IDS),-pci-ids $(abspath $(PCI_IDS)))) \
		-o $(RELEASE_WORK)/linux-$*/image.tar
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(RELEASE_TOOLS)/pkgbuild -root . -config packaging/nfpm.yaml \
		-binary $(RELEASE_WORK)/linux-$*/gpu-device-plugin \
		-dp $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dp \
		-dra $(RELEASE_WORK)/linux-$*/gpu-device-plugin-dra \
		-controller $(RELEASE_WORK)/linux-$*/gpu-device-plugin-controller \
		-hook $(RELEASE_WORK)/linux-$*/gpu-device-plugin-cdi-hook \
		-version '$(VERSION)' -license '$(LICENSE)' -o $(RELEASE_DIR)

release-verify:
	cd tools && $(GO) run ./releasebuild verify -version '$(VERSION)' -dir $(abspath $(RELEASE_DIR)) -platforms '$(RELEASE_PLATFORMS)'
	cd '$(RELEASE_DIR)' && sha256sum -c --quiet SHA256SUMS

# The tools' own unit tests; the image, chart, manifests and packages are
# tested end to end in e2e/deploy (part of conformance).
tools-test:
	cd tools && $(GO) vet ./... && $(GO) test -count=1 ./...

test: tools-test

deploy-test:
	cd e2e && $(GO) test -count=1 -v ./deploy/

# End to end on a real Kubernetes node (e2e/cluster/README.md).
#   make e2e-cluster       a local single-node cluster on 127.0.0.1 (Kubernetes, etcd and
#                          containerd built from the Go module proxy into e2e/cluster/.cache,
#                          once per version), the plugin's chart on the mock NVML library,
#                          and the suite; the cluster stays up for kubectl until
#   make e2e-cluster-down  which stops it and removes everything it made.
#                          E2E_RUN=TestUpgrade (a go test -run pattern) runs only those lanes.
#   make e2e-kind          the same suite on a kind cluster (e2e/kind/kind.sh): Docker if none
#                          answers (Debian's docker.io, a daemon of its own), kind built from
#                          its module, and a node image built here (KIND_NODE_IMAGE=local, the
#                          default) or kind's upstream kindest/node (KIND_NODE_IMAGE=upstream);
#                          the cluster stays up until
#   make e2e-kind-down     which deletes it, stops that daemon and removes everything it made.
.PHONY: e2e-cluster e2e-scale e2e-computedomain e2e-cluster-down e2e-kind e2e-kind-down

E2E_RUN ?=
e2e-cluster:
	e2e/cluster/build.sh
	e2e/cluster/cluster.sh up
	e2e/cluster/suite.sh e2e/cluster/.run/suite.env $(if $(E2E_RUN),-run '$(E2E_RUN)')

# The API server's load from a fleet of plugins (e2e/cluster/scale): N real
# plugin processes in DRA mode as fake nodes (E2E_SCALE_NODES, default 100)
# against the cluster make e2e-cluster left up; figures in e2e/cluster/.report/scale.txt.
e2e-scale:
	E2E_SUITE_PKG=./cluster/scale/ e2e/cluster/suite.sh e2e/cluster/.run/suite.env -run TestScale

# ComputeDomains end to end (e2e/cluster/computedomain): six fake GB200 nodes on
# two cliques (DRA plugin processes with the stand-in nvidia-imex) and the
# controller against the cluster make e2e-cluster left up; figures in
# e2e/cluster/.report/computedomain.txt.
e2e-computedomain:
	E2E_SUITE_PKG=./cluster/computedomain/ e2e/cluster/suite.sh e2e/cluster/.run/suite.env -run TestComputeDomain

e2e-cluster-down:
	e2e/cluster/cluster.sh down

e2e-kind:
	e2e/kind/kind.sh up
	e2e/cluster/suite.sh e2e/kind/.run/suite.env $(if $(E2E_RUN),-run '$(E2E_RUN)')

e2e-kind-down:
	e2e/kind/kind.sh down
